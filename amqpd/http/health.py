"""Health checks with RabbitMQ 3.10's paths and bodies (REFERENCE §2.4), plus /health/*.

``/api/health/checks/*`` and ``/api/aliveness-test/{vhost}`` need a management user, as in
RabbitMQ. ``/health/ready``, ``/health/active`` and ``/health/standby`` need no
credentials and read a few attributes only, so a load balancer's ``httpchk`` can poll
them every 100 ms:

- ``/health/ready``: 200 while the node serves its role (an active's AMQP listeners are
  up; a warren standby is following) and no resource alarm blocks publishers.
- ``/health/active``: 200 only on the node that holds the warren lease and takes
  publishes (HAProxy sends clients there: etc/haproxy.cfg); 503 everywhere else. A single
  node without ``[replication]`` is its own active node whenever it is ready.
- ``/health/standby``: 200 on a warren standby that is connected and within ``max_lag``.
"""

from __future__ import annotations

from typing import Any

from amqpd.broker.api import Message, WarrenStatus, codec, generate_name
from amqpd.http.core import Ctx, Router, bad_request, json_response, not_found
from amqpd.http.overview import alarm_set

ALARM_RESOURCES = {"memory": "memory", "disk": "disk space", "fd": "file descriptors",
                   "file_descriptors": "file descriptors"}
# the resource names of RabbitMQ's alarm terms ({resource_limit, Resource, Node})
ERLANG_RESOURCES = {"memory": "memory", "disk": "disk", "fd": "file_descriptors",
                    "file_descriptors": "file_descriptors"}
PROTOCOL_ALIASES = {"amqp091": "amqp", "amqp": "amqp", "amqp/ssl": "amqps", "amqps": "amqps",
                    "http": "http", "https": "https"}
ALIVENESS_QUEUE = "aliveness-test"


def ok(**extra: Any) -> Any:
    return json_response({"status": "ok", **extra})


def failed(reason: str, **extra: Any) -> Any:
    return json_response({"status": "failed", "reason": reason, **extra}, 503)


def _alarms(ctx: Ctx) -> list[dict[str, str]]:
    node = ctx.api.node_name()
    return [{"resource": ALARM_RESOURCES.get(a, a), "node": node}
            for a in sorted(alarm_set(ctx.api))]


async def alarms(ctx: Ctx) -> Any:
    found = _alarms(ctx)
    if found:
        return failed("There are alarms in effect in the cluster", alarms=found)
    return ok()


async def local_alarms(ctx: Ctx) -> Any:
    found = _alarms(ctx)
    if found:
        return failed("There are alarms in effect on the node", alarms=found)
    return ok()


def _ports(ctx: Ctx) -> list[int]:
    ports = [port for _, _, port in ctx.api.listeners()]
    http_port = ctx.request.app["listener"]["port"]  # this HTTP listener, once bound
    if http_port:
        ports.append(http_port)
    return ports


async def port_listener(ctx: Ctx) -> Any:
    try:
        port = int(ctx.params["port"])
    except ValueError:
        raise bad_request("Invalid port") from None
    ports = _ports(ctx)
    if port in ports:
        return ok(port=port)
    return failed("No active listener", missing=port, ports=ports)


async def protocol_listener(ctx: Ctx) -> Any:
    protocols = {proto for proto, _, _ in ctx.api.listeners()}
    protocols.add("https" if ctx.request.app["listener"]["tls"] else "http")
    wanted = [p.strip() for p in ctx.params["protocol"].split(",") if p.strip()]
    missing = [p for p in wanted if PROTOCOL_ALIASES.get(p.lower(), p.lower()) not in protocols]
    if not wanted or missing:
        names = sorted({"amqp091" if p == "amqp" else p for p in protocols})
        return failed("No active listener", missing=",".join(missing) or ctx.params["protocol"],
                      protocols=names)
    return ok(protocol=ctx.params["protocol"])


async def virtual_hosts(ctx: Ctx) -> Any:
    return ok()  # every vhost lives in the broker process: if it answers, they are up


async def mirror_sync_critical(ctx: Ctx) -> Any:
    """503 when stopping this node would leave a mirrored queue without a synchronised
    replica (always ok on a single node: nothing is mirrored there)."""
    critical = ctx.api.mirror_sync_critical()
    if critical:
        return failed("There are classic mirrored queues without online synchronised "
                      "mirrors (queues that would potentially lose data if the target "
                      "node is shut down)",
                      queues=[{"name": name, "vhost": vhost} for vhost, name in critical])
    return ok()


async def quorum_critical(ctx: Ctx) -> Any:
    """503 when stopping this node would leave a quorum queue without a majority of
    running members (RabbitMQ's text and queue list); a single node is ok."""
    if ctx.api.cluster() is None:
        return ok(reason="single node cluster")
    critical = ctx.api.quorum_critical()
    if critical:
        return failed("There are quorum queues that would lose their quorum if the "
                      "target node is shut down",
                      queues=[{"name": name, "virtual_host": vhost, "type": "quorum",
                               "readable_name": f"queue '{name}' in vhost '{vhost}'"}
                              for vhost, name in critical])
    return ok()


async def node_healthcheck(ctx: Ctx) -> Any:
    """The 3.x ``/api/healthchecks/node[/{node}]`` (AMQPStorm's ``healthchecks.get``):
    ok unless a resource alarm is in effect; another node's name is 404, as RabbitMQ
    answers for a node that is not in the cluster."""
    node = ctx.api.node_name()
    wanted = ctx.params.get("node")
    if wanted is not None and wanted != node:
        raise not_found()
    found = sorted(alarm_set(ctx.api))
    if found:
        terms = ",".join(f"{{resource_limit,{ERLANG_RESOURCES.get(a, a)},'{node}'}}"
                         for a in found)
        return failed(f"resource alarm(s) in effect:[{terms}]")
    return ok()


async def aliveness_test(ctx: Ctx) -> Any:
    """Declare, publish, get back; 503 while an alarm blocks publishers (REFERENCE §6).

    The queue is deleted afterwards, unlike RabbitMQ 3.x, which left it behind."""
    vh = ctx.vhost()
    if alarm_set(ctx.api):
        return failed("publishers are blocked by a resource alarm", alarms=_alarms(ctx))
    name = ALIVENESS_QUEUE
    api = ctx.api
    if api.find_queue(vh.name, name) is not None:  # someone's own queue: never touch it
        name = generate_name(ALIVENESS_QUEUE + "-")
    api.declare_queue(vh, name, durable=False, auto_delete=False)
    got = None
    try:
        api.publish(vh, "", Message("", name, codec.encode_properties({}), b"test_message"),
                    None)
        got = api.get(vh, name)
        if got is not None:
            api.ack([got])
    finally:
        api.delete_queue(vh, name)
    if got is None or got.body != b"test_message":
        return failed("aliveness-test queue is empty")
    return ok()


def _warren_fields(warren: WarrenStatus) -> dict[str, Any]:
    return {"role": warren.role, "epoch": warren.epoch, "active_node": warren.active_node()}


async def ready(ctx: Ctx) -> Any:
    """Unauthenticated readiness for load balancers."""
    api = ctx.api
    warren = api.warren()
    if api.stopping():
        return failed("node is shutting down")
    if warren is not None and warren.role == "standby":
        pass  # a standby serves no client: following its active is its whole job
    elif not any(proto in ("amqp", "amqps") for proto, _, _ in api.listeners()):
        return failed("No active listener")
    found = _alarms(ctx)
    if found:
        return failed("There are alarms in effect on the node", alarms=found)
    return ok()


async def active(ctx: Ctx) -> Any:
    """200 only where clients belong: the lease holder that takes publishes."""
    warren = ctx.api.warren()
    if warren is None:
        return await ready(ctx)
    if warren.accepting_publishes() and not _alarms(ctx):
        return ok(**_warren_fields(warren))
    return failed(warren.refusal() or "publishers are blocked by a resource alarm",
                  **_warren_fields(warren))


async def standby(ctx: Ctx) -> Any:
    """200 on an in-sync warren standby (it could take over without losing a confirm)."""
    warren = ctx.api.warren()
    if warren is None:
        return failed("this node is not part of a warren (no [replication] section)")
    if warren.in_sync():
        return ok(**_warren_fields(warren), replication=_lag(warren))
    reason = ("not a standby" if warren.role != "standby"
              else "standby is not in sync with its active")
    return failed(reason, **_warren_fields(warren), replication=_lag(warren))


def _lag(warren: WarrenStatus) -> dict[str, Any]:
    rep = warren.replication_status()
    return {k: rep[k] for k in ("connected", "last_seq", "active_seq", "lag_records",
                                "lag_seconds") if k in rep}


async def certificate_expiration(ctx: Ctx) -> Any:
    from amqpd.tls import certificate_expires_within

    try:
        within = int(ctx.params["within"])
    except ValueError:
        raise bad_request("Invalid value for within") from None
    unit = ctx.params["unit"]
    days_per = {"days": 1, "weeks": 7, "months": 30, "years": 365}.get(unit)
    if days_per is None or within < 0:
        raise bad_request("Invalid unit")
    expiring = certificate_expires_within(ctx.api.settings, within * days_per)
    if expiring:
        return failed("Certificates expiring", expired=expiring)
    return ok()


async def node_can_declare(ctx: Ctx) -> Any:
    """503 while a definition change made on this node (a declare, an HTTP write) has
    waited longer than ``definition_timeout`` to become durable: the node cannot
    complete its own declares (issue 28's silent node), with what they wait on."""
    overdue = ctx.api.overdue_waits("definitions")
    if not overdue:
        return ok()
    waits = [{"waited": round(waited, 1), "waits_on": what} for waited, _src, what in overdue]
    # what the store's commit itself waits on (the replicas), if anything is overdue there
    blocking = [what for _w, name, what in ctx.api.overdue_waits() if name != "definitions"]
    return failed(f"Definition changes on this node have not become durable within "
                  f"{ctx.api.wait_limit():g} s (declares and definition writes do not "
                  "complete)", waits=waits, blocked_by=blocking[:20])


def routes(r: Router) -> None:
    r.get("/api/health/checks/alarms", alarms)
    r.get("/api/health/checks/local-alarms", local_alarms)
    r.get("/api/health/checks/port-listener/{port}", port_listener)
    r.get("/api/health/checks/protocol-listener/{protocol}", protocol_listener)
    r.get("/api/health/checks/virtual-hosts", virtual_hosts)
    r.get("/api/health/checks/node-is-mirror-sync-critical", mirror_sync_critical)
    r.get("/api/health/checks/node-is-quorum-critical", quorum_critical)
    r.get("/api/health/checks/node-can-declare", node_can_declare)
    r.get("/api/health/checks/certificate-expiration/{within}/{unit}", certificate_expiration)
    r.get("/api/aliveness-test/{vhost}", aliveness_test)
    r.get("/api/healthchecks/node", node_healthcheck)
    r.get("/api/healthchecks/node/{node}", node_healthcheck)
    r.get("/health/ready", ready, auth=False)
    r.get("/health/active", active, auth=False)
    r.get("/health/standby", standby, auth=False)
    r.get("/api/health/ready", ready, auth=False)


__all__ = ["not_found", "routes"]
