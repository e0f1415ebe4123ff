"""The ``workers`` setting: default, the three spellings, and what phase 1 refuses."""

from __future__ import annotations

import os

import pytest

from amqpd.cli import build_parser
from amqpd.config import ConfigError, load_settings, worker_count


def test_default_is_one_process() -> None:
    settings = load_settings(None, environ={})
    assert settings.workers == 1 and worker_count(settings) == 1


def test_file_env_and_flag(tmp_path: os.PathLike[str]) -> None:
    path = f"{tmp_path}/amqpd.toml"
    with open(path, "w") as fh:
        fh.write("workers = 3\n")
    assert load_settings(path, environ={}).workers == 3
    assert load_settings(path, environ={"AMQPD_WORKERS": "2"}).workers == 2
    args = build_parser().parse_args(["--workers", "4"])
    assert load_settings(path, {"workers": args.workers},
                         environ={"AMQPD_WORKERS": "2"}).workers == 4


def test_zero_means_the_cores_this_process_may_use() -> None:
    settings = load_settings(None, {"workers": 0}, environ={})
    assert worker_count(settings) == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("value", [-1, 257])
def test_out_of_range_is_refused(value: int) -> None:
    with pytest.raises(ConfigError, match="setting 'workers' must be"):
        load_settings(None, {"workers": value}, environ={})


@pytest.mark.parametrize(("overrides", "what"), [
    ({"cluster_name": "c", "cluster_etcd": "http://127.0.0.1:2379"}, "a \\[cluster\\]"),
    ({"replication_listen": "127.0.0.1:0"}, "a warren"),
    ({"stream": True}, "the stream protocol"),
    ({"tls_cert": "c.pem"}, "TLS listeners"),
])
def test_phase_one_refuses_what_several_workers_cannot_serve(
        overrides: dict[str, object], what: str) -> None:
    with pytest.raises(ConfigError, match=f"'workers' = 2: {what}"):
        load_settings(None, {"workers": 2, **overrides}, environ={})
    # the same settings with one worker are not refused for it
    try:
        load_settings(None, {"workers": 1, **overrides}, environ={})
    except ConfigError as exc:
        assert "workers" not in str(exc)


def test_a_worker_gets_its_share_of_the_node_memory_limits() -> None:
    from amqpd.workers.worker import worker_settings

    argv = ["--workers", "2", "--data-dir", "/tmp/amqpd-node", "--node-name", "n@h"]
    w = worker_settings(argv, 1, "http://127.0.0.1:1")
    assert w.workers == 1 and w.data_dir == "/tmp/amqpd-node/workers/w1"
    assert w.node_name == "n@h-w1" and w.cluster_name == "n@h"
    assert w.cluster.name == "workers" and w.cluster.etcd == ["http://127.0.0.1:1"]
    assert w.bind == "127.0.0.1" and w.port == 0 and w.http_port == 0
    assert w.vm_memory_high_watermark == 0.2
    assert w.message_memory_budget == 128 * 1024 * 1024
