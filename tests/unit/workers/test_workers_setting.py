"""The ``workers`` setting: default, the three spellings, what phase 1 refuses and what
a worker's own settings are."""

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


@pytest.mark.parametrize("overrides", [
    {"tls_cert": "c.pem", "tls_key": "k.pem"},
    {"tls_cert": "c.pem", "tls_key": "k.pem", "http_tls": True},
    {"plugins": ["shovel", "federation"]},
])
def test_tls_and_plugins_run_with_several_workers(overrides: dict[str, object]) -> None:
    settings = load_settings(None, {"workers": 2, **overrides}, environ={})
    assert worker_count(settings) == 2


def test_static_shovels_run_with_several_workers(tmp_path: os.PathLike[str]) -> None:
    path = f"{tmp_path}/amqpd.toml"
    with open(path, "w") as fh:
        fh.write('workers = 2\nplugins = ["shovel"]\n[[shovels]]\nname = "s"\n'
                 'src-uri = "amqp://"\nsrc-queue = "a"\ndest-uri = "amqp://"\n'
                 'dest-queue = "b"\n')
    assert len(load_settings(path, environ={}).shovels) == 1


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


def test_a_worker_listens_privately_and_static_shovels_are_worker_zeros(
        tmp_path: os.PathLike[str]) -> None:
    """amqps and the API: a private loopback listener per worker (the node's ports are
    the supervisor's), the API plain HTTP behind the front; static shovels on worker 0
    only (each worker running them would run each shovel twice)."""
    from amqpd.workers.worker import worker_settings

    path = f"{tmp_path}/amqpd.toml"
    with open(path, "w") as fh:
        fh.write('plugins = ["shovel"]\ntls_cert = "c.pem"\ntls_key = "k.pem"\n'
                 'http_tls = true\ntls_port = 5671\n[[shovels]]\nname = "s"\n'
                 'src-uri = "amqp://"\nsrc-queue = "a"\ndest-uri = "amqp://"\n'
                 'dest-queue = "b"\n')
    argv = ["--config", path, "--workers", "2", "--data-dir", f"{tmp_path}/node"]
    w0, w1 = (worker_settings(argv, i, "http://127.0.0.1:1") for i in (0, 1))
    for w in (w0, w1):
        assert w.tls_port == 0 and w.tls_cert == "c.pem" and w.http_tls is False
        assert w.plugins == ["shovel"]
    assert [t["name"] for t in w0.shovels] == ["s"] and w1.shovels == []
