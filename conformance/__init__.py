"""The amqpd conformance suite: judge any AMQP 0-9-1 broker, RabbitMQ included.

It talks to a broker URL only (never imports amqpd). Run ``amqpd-conformance --url ...``
or ``python -m conformance --url ...``; see ``conformance/README.md``.
"""

from conformance.framework import REGISTRY, Case, CaseFailure, Context, Skip, case
from conformance.runner import Result, run_all, select

__all__ = ["REGISTRY", "Case", "CaseFailure", "Context", "Result", "Skip", "case", "run_all",
           "select"]
