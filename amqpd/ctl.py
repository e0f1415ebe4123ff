"""``amqpctl``: operate amqpd through its HTTP API, with rabbitmqctl's command names.

    amqpctl [--url URL | --config FILE] [-u USER] [--password PW] [-p VHOST] [--json]
            COMMAND [ARGS]

``list_*`` commands take rabbitmqctl's column names (``amqpctl list_queues name
messages consumers``); output is an aligned table for people, or JSON (``--json``) for
scripts. Connection settings also come from ``AMQPCTL_URL``, ``AMQPCTL_USERNAME`` and
``AMQPCTL_PASSWORD``. Without a URL, amqpctl reaches the broker of this machine the way
rabbitmqctl does: from the broker's own config file and ``AMQPD_*`` variables (address,
port, TLS and credentials; see ``amqpd/ctl_target.py``).

Exit codes (stable, for scripts):

====  ===========================================================================
0     success
1     the object does not exist (HTTP 404)
64    usage error: unknown command, wrong arguments
65    bad input: malformed JSON argument or definitions file, refused by the API (400)
66    an input file does not exist or cannot be read
69    broker unavailable: cannot connect, or it answered 5xx / 503
77    not authorised (HTTP 401/403)
====  ===========================================================================
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TextIO
from urllib.parse import quote

from amqpd import ctl_target
from amqpd.config import ConfigError

EX_OK = 0
EX_NOT_FOUND = 1
EX_USAGE = 64
EX_DATAERR = 65
EX_NOINPUT = 66
EX_UNAVAILABLE = 69
EX_NOPERM = 77


class CtlError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def q(value: str) -> str:
    return quote(value, safe="")


# ---------------------------------------------------------------------------- HTTP client
class Client:
    def __init__(self, url: str, username: str, password: str, timeout: float,
                 context: ssl.SSLContext | None, origin: str = "") -> None:
        self.url = url.rstrip("/")
        self.origin = f" (from {origin})" if origin else ""
        self.auth = base64.b64encode(f"{username}:{password}".encode()).decode()
        self.timeout = timeout
        self.context = context

    def call(self, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Basic {self.auth}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise _http_error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CtlError(f"cannot connect to {self.url}{self.origin}: {reason}",
                           EX_UNAVAILABLE) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")

    def get(self, path: str) -> Any:
        return self.call("GET", path)


def _http_error(exc: urllib.error.HTTPError) -> CtlError:
    try:
        body = json.loads(exc.read() or b"{}")
        reason = body.get("reason") or body.get("error") or exc.reason
    except (ValueError, AttributeError):
        reason = exc.reason
    code = exc.code
    if code == 404:
        return CtlError(f"not found: {reason}", EX_NOT_FOUND)
    if code in (401, 403):
        return CtlError(f"not authorised: {reason}", EX_NOPERM)
    if code >= 500:
        return CtlError(f"broker error ({code}): {reason}", EX_UNAVAILABLE)
    return CtlError(f"refused ({code}): {reason}", EX_DATAERR)


# ---------------------------------------------------------------------------- output
def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def print_table(rows: list[dict[str, Any]], columns: list[str], out: TextIO,
                headers: bool = True) -> None:
    table = [[_cell(r.get(c)) for c in columns] for r in rows]
    if headers:
        table.insert(0, list(columns))
    widths = [max((len(row[i]) for row in table), default=0) for i in range(len(columns))]
    for row in table:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                  .rstrip() + "\n")


# ---------------------------------------------------------------------------- list commands
def _dotted(item: dict[str, Any], path: str) -> Any:
    value: Any = item
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


# rabbitmqctl info item -> where it lives in the management JSON (absent = same name)
ALIASES: dict[str, dict[str, str]] = {
    "bindings": {"source_name": "source", "destination_name": "destination",
                 "destination_kind": "destination_type"},
    "consumers": {"queue_name": "queue.name", "channel_pid": "channel_details.name",
                  "channel_name": "channel_details.name"},
    "channels": {"pid": "name", "connection": "connection_details.name"},
    "connections": {"pid": "name"},
    "queues": {"pid": "node", "message_bytes_ram": "message_bytes",
               # a stream's log (amqpd.broker.stream): size on disk, segments, offsets,
               # each consumer's position
               "stream_size_bytes": "stream.size_bytes", "stream_segments": "stream.segments",
               "stream_first_offset": "stream.first_offset",
               "stream_last_offset": "stream.last_offset",
               "stream_consumers": "stream.consumers"},
}
CONSTANTS: dict[str, dict[str, Any]] = {"bindings": {"source_kind": "exchange"}}
LISTS: dict[str, tuple[str, bool, list[str]]] = {
    # command suffix: (API path, per-vhost?, rabbitmqctl's default columns)
    "queues": ("/api/queues", True, ["name", "messages"]),
    "exchanges": ("/api/exchanges", True, ["name", "type"]),
    "bindings": ("/api/bindings", True, ["source_name", "source_kind", "destination_name",
                                         "destination_kind", "routing_key", "arguments"]),
    "connections": ("/api/connections", False, ["user", "peer_host", "peer_port", "state"]),
    "channels": ("/api/channels", False, ["name", "user", "consumer_count",
                                          "messages_unacknowledged"]),
    "consumers": ("/api/consumers", True, ["queue_name", "channel_pid", "consumer_tag",
                                           "ack_required", "prefetch_count", "active",
                                           "arguments"]),
    "users": ("/api/users", False, ["name", "tags"]),
    "vhosts": ("/api/vhosts", False, ["name"]),
    "permissions": ("/api/permissions", False, ["user", "configure", "write", "read"]),
    "policies": ("/api/policies", True, ["vhost", "name", "pattern", "apply-to", "definition",
                                         "priority"]),
    "parameters": ("/api/parameters", False, ["component", "name", "value"]),
}


def run_list(kind: str, client: Client, args: argparse.Namespace, out: TextIO) -> int:
    path, per_vhost, default_cols = LISTS[kind]
    columns = list(args.columns) or default_cols
    if per_vhost:
        path += "/" + q(args.vhost)
    items = client.get(path)
    if kind == "permissions":
        items = [i for i in items if i.get("vhost") == args.vhost]
    if kind == "parameters":
        items = [i for i in items if i.get("vhost") == args.vhost]
    aliases = ALIASES.get(kind, {})
    constants = CONSTANTS.get(kind, {})
    rows = []
    for item in items:
        row = {}
        for col in columns:
            if col in constants:
                row[col] = constants[col]
            else:
                row[col] = _dotted(item, aliases.get(col, col))
        rows.append(row)
    if items and not args.json:
        known = set(items[0]) | set(aliases) | set(constants)
        unknown = [c for c in columns if c.split(".")[0] not in known]
        if unknown:
            raise CtlError(f"unknown column(s) for list_{kind}: {', '.join(unknown)}",
                           EX_USAGE)
    if args.json:
        json.dump(rows, out, indent=None)
        out.write("\n")
    else:
        print_table(rows, columns, out, headers=not args.no_table_headers)
    return EX_OK


# ---------------------------------------------------------------------------- other commands
def _json_arg(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CtlError(f"{what} is not valid JSON: {exc}", EX_DATAERR) from None


def _done(args: argparse.Namespace, out: TextIO, message: str, data: Any = None) -> int:
    if args.json:
        json.dump({"result": "ok", "message": message} if data is None else data, out)
        out.write("\n")
    elif not args.quiet:
        out.write(message + "\n")
    return EX_OK


def cmd_status(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    ov = c.get("/api/overview")
    nodes = c.get("/api/nodes") if "administrator" in _tags(c) or "monitoring" in _tags(c) \
        else []
    status = {
        "node": ov.get("node"), "cluster_name": ov.get("cluster_name"),
        "product": f"{ov.get('product_name')} {ov.get('product_version')}",
        "rabbitmq_api_version": ov.get("rabbitmq_version"),
        "listeners": [f"{x['protocol']}:{x['ip_address']}:{x['port']}"
                      for x in ov.get("listeners", [])],
        "connections": ov["object_totals"]["connections"],
        "channels": ov["object_totals"]["channels"],
        "queues": ov["object_totals"]["queues"],
        "consumers": ov["object_totals"]["consumers"],
        "messages": ov["queue_totals"]["messages"],
        "messages_ready": ov["queue_totals"]["messages_ready"],
        "messages_unacknowledged": ov["queue_totals"]["messages_unacknowledged"],
    }
    if nodes:
        n = nodes[0]
        status.update({"memory_used": n.get("mem_used"), "memory_limit": n.get("mem_limit"),
                       "memory_alarm": n.get("mem_alarm"), "disk_free": n.get("disk_free"),
                       "disk_free_alarm": n.get("disk_free_alarm"),
                       "uptime_ms": n.get("uptime")})
    if a.json:
        json.dump(status, out)
        out.write("\n")
    else:
        for k, v in status.items():
            out.write(f"{k}: {', '.join(v) if isinstance(v, list) else _cell(v)}\n")
    return EX_OK


CLUSTER_COLUMNS = ["name", "role", "epoch", "running", "in_sync", "lag_records",
                   "lag_bytes", "lag_seconds"]


def _cluster_status(c: Client) -> dict[str, Any] | None:
    """The cluster's status (``GET /api/cluster/status``), None outside a cluster."""
    try:
        found = c.get("/api/cluster/status")
    except CtlError as exc:
        if exc.code == EX_NOT_FOUND:  # a broker from before issue 15
            return None
        raise
    return found if isinstance(found, dict) and found.get("cluster") else None


def cmd_cluster_status(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    """rabbitmqctl cluster_status: in a cluster, its name, the members (disk nodes), the
    running nodes, the partitions this node sees and whether it is paused; in a warren,
    every node's role, epoch and replication lag. From whichever node is asked."""
    status = _cluster_status(c)
    if status is not None:
        return _print_cluster(c, a, out, status)
    rows = []
    for n in c.get("/api/nodes"):
        rep = n.get("replication") or {}
        lag = {k: rep.get(k) for k in ("lag_records", "lag_bytes", "lag_seconds")}
        if n.get("amqpd_role") == "active" and rep.get("standbys"):
            # the active knows each standby's lag better than their last etcd record
            lag = {k: ", ".join(f"{s.get('name')}={s.get(k)}" for s in rep["standbys"])
                   for k in lag}
        rows.append({"name": n.get("name"), "role": n.get("amqpd_role") or "single",
                     "epoch": n.get("amqpd_epoch"), "running": n.get("running", True),
                     "in_sync": n.get("amqpd_in_sync"), **lag})
    if a.json:
        json.dump(rows, out)
        out.write("\n")
        return EX_OK
    print_table(rows, CLUSTER_COLUMNS, out, not a.no_table_headers)
    return EX_OK


def _print_cluster(c: Client, a: argparse.Namespace, out: TextIO,
                   status: dict[str, Any]) -> int:
    nodes = c.get("/api/nodes")
    if a.json:
        json.dump({**status, "nodes": nodes}, out)
        out.write("\n")
        return EX_OK
    out.write(f"Cluster status of node {status['node']} ...\n")
    out.write(f"Basics\n\nCluster name: {status['cluster_name']}\n\n")
    for title, key in (("Disk Nodes", "disk_nodes"), ("Running Nodes", "running_nodes")):
        out.write(f"{title}\n\n" + "".join(f"{n}\n" for n in status[key]) + "\n")
    out.write("Network Partitions\n\n")
    partitions = status.get("partitions") or {}
    if not partitions:
        out.write("(none)\n")
    for node, others in partitions.items():
        out.write(f"Node {node} cannot communicate with {', '.join(others)}\n")
    out.write(f"\nPartition handling: {status.get('partition_handling')}\n")
    paused = status.get("paused")
    out.write(f"Paused: {_cell(paused)}"
              + (f" ({status.get('pause_reason')})" if paused else "") + "\n")
    return EX_OK


def cmd_join_cluster(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    """Make the node asked a member of the cluster ``a.node`` belongs to (again, after
    forget_cluster_node; its definitions are replaced by the cluster's)."""
    status = c.call("POST", "/api/cluster/join", {"node": a.node})
    if a.json:
        json.dump(status, out)
        out.write("\n")
    else:
        out.write(f"Clustering node {status.get('node')} with {a.node}\n")
    return EX_OK


def cmd_forget_cluster_node(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    c.call("DELETE", f"/api/cluster/nodes/{q(a.node)}")
    if not a.quiet:
        out.write(f"Removing node {a.node} from the cluster\n")
    return EX_OK


def cmd_set_cluster_name(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    c.call("PUT", "/api/cluster-name", {"name": a.name})
    if not a.quiet:
        out.write(f"Setting cluster name to {a.name} ...\n")
    return EX_OK


def _tags(c: Client) -> list[str]:
    me = c.get("/api/whoami")
    return list(me.get("tags", [])) if isinstance(me, dict) else []


def cmd_add_user(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    try:
        c.get(f"/api/users/{q(a.name)}")
    except CtlError as exc:
        if exc.code != EX_NOT_FOUND:
            raise
    else:
        raise CtlError(f"user '{a.name}' already exists", EX_DATAERR)
    c.call("PUT", f"/api/users/{q(a.name)}", {"password": a.new_password, "tags": a.tags or ""})
    return _done(a, out, f"Adding user \"{a.name}\" ...")


def cmd_delete_user(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    c.call("DELETE", f"/api/users/{q(a.name)}")
    return _done(a, out, f"Deleting user \"{a.name}\" ...")


def cmd_change_password(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    user = c.get(f"/api/users/{q(a.name)}")
    c.call("PUT", f"/api/users/{q(a.name)}", {"password": a.new_password,
                                             "tags": user.get("tags", [])})
    return _done(a, out, f"Changing password for user \"{a.name}\" ...")


def cmd_set_user_tags(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    c.get(f"/api/users/{q(a.name)}")
    c.call("PUT", f"/api/users/{q(a.name)}", {"tags": list(a.tags)})
    return _done(a, out, f"Setting tags for user \"{a.name}\" to [{', '.join(a.tags)}] ...")


def cmd_add_vhost(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    body = {"description": a.description} if a.description else {}
    c.call("PUT", f"/api/vhosts/{q(a.name)}", body)
    return _done(a, out, f"Adding vhost \"{a.name}\" ...")


def cmd_delete_vhost(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    c.call("DELETE", f"/api/vhosts/{q(a.name)}")
    return _done(a, out, f"Deleting vhost \"{a.name}\" ...")


def cmd_set_permissions(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    try:
        c.call("PUT", f"/api/permissions/{q(a.vhost)}/{q(a.user)}",
               {"configure": a.conf, "write": a.write, "read": a.read})
    except CtlError as exc:
        if "vhost_or_user_not_found" not in str(exc):
            raise
        # the API answers 400 for either (as RabbitMQ's); say which, as rabbitmqctl does
        try:
            c.get(f"/api/vhosts/{q(a.vhost)}")
        except CtlError:
            raise CtlError(f"Virtual host {a.vhost} does not exist", EX_NOT_FOUND) from None
        raise CtlError(f"User {a.user} does not exist", EX_NOT_FOUND) from None
    return _done(a, out, f"Setting permissions for user \"{a.user}\" in vhost \"{a.vhost}\" ...")


def cmd_clear_permissions(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    c.call("DELETE", f"/api/permissions/{q(a.vhost)}/{q(a.user)}")
    return _done(a, out, f"Clearing permissions for user \"{a.user}\" in vhost \"{a.vhost}\" ...")


def cmd_set_policy(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    definition = _json_arg(a.definition, "policy definition")
    c.call("PUT", f"/api/policies/{q(a.vhost)}/{q(a.name)}",
           {"pattern": a.pattern, "definition": definition, "priority": a.priority,
            "apply-to": a.apply_to})
    return _done(a, out, f"Setting policy \"{a.name}\" for pattern \"{a.pattern}\" ...")


def cmd_clear_policy(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    c.call("DELETE", f"/api/policies/{q(a.vhost)}/{q(a.name)}")
    return _done(a, out, f"Clearing policy \"{a.name}\" on vhost \"{a.vhost}\" ...")


def cmd_set_parameter(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    value = _json_arg(a.value, "parameter value")
    c.call("PUT", f"/api/parameters/{q(a.component)}/{q(a.vhost)}/{q(a.name)}",
           {"value": value, "component": a.component, "vhost": a.vhost, "name": a.name})
    return _done(a, out, f"Setting runtime parameter \"{a.name}\" for component "
                         f"\"{a.component}\" ...")


def cmd_clear_parameter(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    c.call("DELETE", f"/api/parameters/{q(a.component)}/{q(a.vhost)}/{q(a.name)}")
    return _done(a, out, f"Clearing runtime parameter \"{a.name}\" for component "
                         f"\"{a.component}\" ...")


def cmd_shovel_status(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    columns = ["name", "vhost", "type", "state", "src_uri", "dest_uri", "reason", "timestamp"]
    rows = [{k: s.get(k, "") for k in columns} for s in c.get("/api/shovels")]
    if a.json:
        json.dump(rows, out)
        out.write("\n")
    else:
        print_table(rows, columns, out, headers=not a.no_table_headers)
    return EX_OK


def cmd_restart_shovel(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    c.call("DELETE", f"/api/shovels/vhost/{q(a.vhost)}/{q(a.name)}/restart")
    return _done(a, out, f"Restarting dynamic Shovel {a.name} in virtual host {a.vhost}")


def cmd_export_definitions(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    defs = c.get("/api/definitions")
    text = json.dumps(defs, indent=2) + "\n"
    if a.path == "-":
        out.write(text)
        return EX_OK
    try:
        with open(a.path, "w") as fh:
            fh.write(text)
    except OSError as exc:
        raise CtlError(f"cannot write {a.path}: {exc}", EX_NOINPUT) from None
    return _done(a, out, f"Exported definitions to {a.path}")


def cmd_import_definitions(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    try:
        text = sys.stdin.read() if a.path == "-" else open(a.path).read()  # noqa: SIM115
    except OSError as exc:
        raise CtlError(f"cannot read {a.path}: {exc}", EX_NOINPUT) from None
    defs = _json_arg(text, "definitions file")
    if not isinstance(defs, dict):
        raise CtlError("definitions file must hold a JSON object", EX_DATAERR)
    c.call("POST", "/api/definitions", defs)
    return _done(a, out, f"Imported definitions from {a.path}")


def _queue_call(c: Client, a: argparse.Namespace, method: str, suffix: str = "",
                body: Any = None) -> None:
    """A call on the queue ``a.name`` in ``a.vhost``; a 404 names them (the API's own
    reason is a bare "Not Found"), and exits 1 as rabbitmqctl does for a missing queue."""
    try:
        c.call(method, f"/api/queues/{q(a.vhost)}/{q(a.name)}{suffix}", body)
    except CtlError as exc:
        if exc.code != EX_NOT_FOUND:
            raise
        raise CtlError(f"queue '{a.name}' in vhost '{a.vhost}' not found",
                       EX_NOT_FOUND) from None


def cmd_purge_queue(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    _queue_call(c, a, "DELETE", "/contents")
    return _done(a, out, f"Purging queue '{a.name}' in vhost '{a.vhost}' ...")


def cmd_delete_queue(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    query = "&".join(x for x in ("if-empty=true" if a.if_empty else "",
                                 "if-unused=true" if a.if_unused else "") if x)
    _queue_call(c, a, "DELETE", f"?{query}" if query else "")
    return _done(a, out, f"Deleting queue '{a.name}' on vhost '{a.vhost}' ...")


def _queue_action(c: Client, a: argparse.Namespace, action: str) -> None:
    _queue_call(c, a, "GET")
    _queue_call(c, a, "POST", "/actions", {"action": action})


def cmd_sync_queue(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    _queue_action(c, a, "sync")
    return _done(a, out, f"Synchronising queue '{a.name}' in vhost '{a.vhost}' ...")


def cmd_cancel_sync_queue(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    _queue_action(c, a, "cancel_sync")
    return _done(a, out, f"Stopping synchronising queue '{a.name}' in vhost '{a.vhost}' ...")


def cmd_close_connection(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    c.call("DELETE", f"/api/connections/{q(a.name)}", headers={"X-Reason": a.reason})
    return _done(a, out, f"Closing connection {a.name}, reason: {a.reason}...")


FEDERATION_COLUMNS = ["id", "type", "name", "vhost", "upstream", "upstream_name", "status",
                      "uri", "timestamp", "error"]


def cmd_federation_status(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    """rabbitmqctl federation_status: the federation plugin's links (all vhosts)."""
    rows = []
    for link in c.get("/api/federation-links"):
        if a.only_down and link.get("status") == "running":
            continue
        kind = link.get("type", "")
        rows.append({"id": link.get("id"), "type": kind, "name": link.get(kind),
                     "vhost": link.get("vhost"),
                     "upstream": link.get("upstream"),
                     "upstream_name": link.get(f"upstream_{kind}"),
                     "status": link.get("status"), "uri": link.get("uri"),
                     "timestamp": link.get("timestamp"), "error": link.get("error", "")})
    if a.json:
        json.dump(rows, out)
        out.write("\n")
    else:
        print_table(rows, FEDERATION_COLUMNS, out, headers=not a.no_table_headers)
    return EX_OK


def cmd_restart_federation_link(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    for link in c.get("/api/federation-links"):
        if link.get("id") == a.link_id:
            c.call("DELETE", f"/api/federation-links/vhost/{q(link['vhost'])}/{q(a.link_id)}/"
                             f"{q(link['node'])}/restart")
            return _done(a, out, f"Restarting federation link with ID {a.link_id} ...")
    raise CtlError(f"Federation link with ID {a.link_id} not found", EX_DATAERR)


def cmd_set_vm_memory_high_watermark(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    node = c.get("/api/overview")["node"]
    if a.value == "absolute":
        if a.bytes is None:
            raise CtlError("absolute needs a number of bytes", EX_USAGE)
        body: dict[str, Any] = {"absolute": int(a.bytes)}
    else:
        try:
            body = {"fraction": float(a.value)}
        except ValueError:
            raise CtlError(f"not a fraction: {a.value!r}", EX_USAGE) from None
    data = c.call("PUT", f"/api/nodes/{q(node)}/memory-high-watermark", body)
    return _done(a, out, f"Setting memory threshold on {node} to {a.value} ...", data)


# ---------------------------------------------------------------------------- parser
class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EX_USAGE, f"{self.prog}: error: {message}\n")


Command = Callable[[Client, argparse.Namespace, TextIO], int]


def _common(suppress: bool) -> Parser:
    """Global options, accepted before or after the command.

    The copy attached to each command has SUPPRESS defaults, so an option given before
    the command is not reset by the command's own defaults."""

    def d(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    common = Parser(add_help=False)
    common.add_argument("--url", default=d(None),
                        help="HTTP API base URL (env AMQPCTL_URL; default: the API of the "
                             "broker configured by --config / AMQPD_* variables)")
    common.add_argument("--config", default=d(None),
                        help="the broker's config file, to find its API and credentials "
                             f"(default: $AMQPD_CONFIG, else {ctl_target.DEFAULT_CONFIG} "
                             "if it exists)")
    common.add_argument("-u", "--username", default=d(None),
                        help="(env AMQPCTL_USERNAME; default: the broker's default_user "
                             "without --url, guest with it)")
    common.add_argument("--password", default=d(None), help="(env AMQPCTL_PASSWORD)")
    common.add_argument("-p", "--vhost", default=d("/"), help="virtual host (default /)")
    common.add_argument("--json", action="store_true", default=d(False),
                        help="machine-readable output")
    common.add_argument("-q", "--quiet", action="store_true", default=d(False))
    common.add_argument("-s", "--silent", "--no-table-headers", dest="no_table_headers",
                        action="store_true", default=d(False),
                        help="tables without the header row")
    common.add_argument("-t", "--timeout", type=float, default=d(30.0))
    common.add_argument("--cacert", default=d(None), help="CA file to verify an https API")
    common.add_argument("--insecure", action="store_true", default=d(False),
                        help="skip https verification")
    return common


_MEMBER = "/api/quorum-queues/{vhost}/{queue}/members/{node}"
_REPLICA = "/api/stream-queues/{vhost}/{queue}/replicas/{node}"


def _replica_edit(c: Client, a: argparse.Namespace, out: TextIO, method: str, path: str,
                  message: str) -> int:
    """A quorum member's or stream replica's add or delete: ``path`` with the vhost,
    queue and node filled in (quoted), then RabbitMQ's progress line."""
    r = c.call(method, path.format(vhost=q(a.vhost), queue=q(a.queue), node=q(a.node)))
    return _done(a, out, message.format(queue=a.queue, node=a.node), r)


def cmd_add_member(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    """``rabbitmq-queues add_member [--vhost V] <queue> <node>``."""
    return _replica_edit(c, a, out, "PUT", _MEMBER, "Adding a replica for "
                         "queue {queue} on node {node}...")


def cmd_delete_member(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    """``rabbitmq-queues delete_member [--vhost V] <queue> <node>``."""
    return _replica_edit(c, a, out, "DELETE", _MEMBER, "Removing a replica "
                         "for queue {queue} on node {node}...")


def cmd_add_replica(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    """``rabbitmq-streams add_replica [--vhost V] <queue> <node>``."""
    return _replica_edit(c, a, out, "PUT", _REPLICA, "Adding a replica for "
                         "queue {queue} on node {node}...")


def cmd_delete_replica(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    """``rabbitmq-streams delete_replica [--vhost V] <queue> <node>``."""
    return _replica_edit(c, a, out, "DELETE", _REPLICA, "Removing a replica "
                         "of queue {queue} on node {node}...")


_SUPER = "/api/stream/super-streams/{vhost}/{name}"


def cmd_add_super_stream(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    """``rabbitmq-streams add_super_stream [--vhost V] NAME [--partitions N |
    --routing-keys K1,K2]`` (3 partitions when neither is given, as there)."""
    if a.routing_keys is not None and a.partitions is not None:
        raise CtlError("Specify --partitions or --routing-keys, not both.", EX_USAGE)
    body: dict[str, Any] = {}
    if a.routing_keys is not None:
        body["binding-keys"] = a.routing_keys
    else:
        body["partitions"] = 3 if a.partitions is None else a.partitions
    arguments = {key: value for key, value in (
        ("max-length-bytes", a.max_length_bytes), ("max-age", a.max_age),
        ("stream-max-segment-size-bytes", a.stream_max_segment_size_bytes),
        ("initial-cluster-size", a.initial_cluster_size),
        ("queue-leader-locator", a.leader_locator)) if value is not None}
    if arguments:
        body["arguments"] = arguments
    c.call("PUT", _SUPER.format(vhost=q(a.vhost), name=q(a.name)), body)
    return _done(a, out, f"Super stream {a.name} has been created")


def cmd_delete_super_stream(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    """``rabbitmq-streams delete_super_stream [--vhost V] NAME``: the exchange and its
    partition streams."""
    c.call("DELETE", _SUPER.format(vhost=q(a.vhost), name=q(a.name)))
    return _done(a, out, f"Super stream {a.name} has been deleted")


def _membership_rows(a: argparse.Namespace, out: TextIO, rows: list[dict[str, Any]]) -> int:
    if a.errors_only:
        rows = [r for r in rows if r.get("result") != "ok"]
    if a.json:
        json.dump(rows, out)
        out.write("\n")
    else:
        print_table(rows, ["vhost", "name", "size", "result"], out)
    return EX_OK


def cmd_grow(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    """``rabbitmq-queues grow <node> <all|even> [--vhost-pattern P] [--queue-pattern P]
    [--errors-only]``."""
    rows = c.call("POST", "/api/quorum-queues/grow", {
        "node": a.node, "strategy": a.strategy, "vhost_pattern": a.vhost_pattern,
        "queue_pattern": a.queue_pattern})
    return _membership_rows(a, out, rows or [])


def cmd_shrink(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    """``rabbitmq-queues shrink <node> [--errors-only]``."""
    rows = c.call("POST", "/api/quorum-queues/shrink", {"node": a.node})
    return _membership_rows(a, out, rows or [])


def cmd_promote(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    """A static warren standby becomes active (the manual failover without etcd)."""
    r = c.call("POST", "/api/replication/promote", {})
    ports = ", ".join(f"{x['protocol']}:{x['port']}" for x in (r or {}).get("listeners", []))
    return _done(a, out, f"promoted: active at epoch {r['epoch']}, listening on {ports}", r)


def cmd_replication_status(c: Client, a: argparse.Namespace, out: TextIO) -> int:
    r = c.get("/api/replication")
    if a.json:
        json.dump(r, out)
        out.write("\n")
        return EX_OK
    for key in ("node", "role", "epoch", "mode", "last_seq", "active", "connected",
                "lag_records", "lag_seconds", "insync_count", "min_insync_standbys"):
        if key in r:
            out.write(f"{key}: {_cell(r[key])}\n")
    if r.get("standbys"):
        print_table(r["standbys"], ["name", "address", "acked_seq", "lag_records",
                                    "lag_bytes", "lag_seconds", "in_sync"], out)
    return EX_OK


def build_parser() -> argparse.ArgumentParser:
    common = _common(suppress=True)
    parser = Parser(prog="amqpctl", parents=[_common(suppress=False)],
                    description="Operate amqpd through its HTTP API (rabbitmqctl-style).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True

    def add(name: str, func: Command, help_: str, *arguments: tuple[tuple[str, ...],
                                                                    dict[str, Any]]) -> None:
        p = sub.add_parser(name, parents=[common], help=help_, description=help_)
        for flags, kw in arguments:
            p.add_argument(*flags, **kw)
        p.set_defaults(func=func, amqpd_only=name in AMQPD_ONLY)

    def arg(*flags: str, **kw: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
        return flags, kw

    add("status", cmd_status, "node status and totals")
    add("cluster_status", cmd_cluster_status,
        "the cluster's members, running nodes, partitions (in a warren: the nodes' role, "
        "epoch, in-sync, replication lag)")
    add("join_cluster", cmd_join_cluster, "make this node a member of the cluster NODE "
        "is in (again, after forget_cluster_node)", arg("node"))
    add("forget_cluster_node", cmd_forget_cluster_node,
        "remove a stopped node from the cluster's members", arg("node"))
    add("set_cluster_name", cmd_set_cluster_name, "set the cluster's name (cluster-wide)",
        arg("name"))
    for kind in LISTS:
        p = sub.add_parser(f"list_{kind}", parents=[common],
                           help=f"list {kind} (columns like rabbitmqctl)")
        p.add_argument("columns", nargs="*", help="columns (default: "
                       f"{' '.join(LISTS[kind][2])})")
        p.set_defaults(func=lambda c, a, o, kind=kind: run_list(kind, c, a, o))
    add("add_user", cmd_add_user, "create a user", arg("name"),
        arg("new_password", metavar="password"),
        arg("--tags", default="", help="comma-separated tags"))
    add("delete_user", cmd_delete_user, "delete a user", arg("name"))
    add("change_password", cmd_change_password, "set a user's password", arg("name"),
        arg("new_password", metavar="password"))
    add("set_user_tags", cmd_set_user_tags, "replace a user's tags", arg("name"),
        arg("tags", nargs="*"))
    add("add_vhost", cmd_add_vhost, "create a vhost", arg("name"),
        arg("--description", default=""))
    add("delete_vhost", cmd_delete_vhost, "delete a vhost and everything in it", arg("name"))
    add("set_permissions", cmd_set_permissions, "set a user's permissions in a vhost",
        arg("user"), arg("conf"), arg("write"), arg("read"))
    add("clear_permissions", cmd_clear_permissions, "remove a user's permissions in a vhost",
        arg("user"))
    add("set_policy", cmd_set_policy, "set a policy", arg("name"), arg("pattern"),
        arg("definition", help="JSON object"), arg("--priority", type=int, default=0),
        arg("--apply-to", default="all"))
    add("clear_policy", cmd_clear_policy, "remove a policy", arg("name"))
    add("set_parameter", cmd_set_parameter, "set a runtime parameter", arg("component"),
        arg("name"), arg("value", help="JSON value"))
    add("clear_parameter", cmd_clear_parameter, "remove a runtime parameter",
        arg("component"), arg("name"))
    add("shovel_status", cmd_shovel_status, "status of every shovel (plugin 'shovel')")
    add("restart_shovel", cmd_restart_shovel, "restart a dynamic shovel", arg("name"))
    add("export_definitions", cmd_export_definitions, "write definitions JSON (- = stdout)",
        arg("path"))
    add("import_definitions", cmd_import_definitions, "load definitions JSON (- = stdin)",
        arg("path"))
    add("purge_queue", cmd_purge_queue, "remove a queue's ready messages", arg("name"))
    add("add_member", cmd_add_member, "add a member (replica) on NODE to a quorum queue's "
        "group (rabbitmq-queues add_member)", arg("queue"), arg("node"))
    add("delete_member", cmd_delete_member, "remove NODE's member from a quorum queue's "
        "group (rabbitmq-queues delete_member)", arg("queue"), arg("node"))
    add("add_replica", cmd_add_replica, "add a replica on NODE to a stream "
        "(rabbitmq-streams add_replica)", arg("queue"),
        arg("node"))
    add("delete_replica", cmd_delete_replica, "remove NODE's replica from a stream "
        "(rabbitmq-streams delete_replica)", arg("queue"), arg("node"))
    add("add_super_stream", cmd_add_super_stream, "create a super stream: a direct "
        "exchange NAME and partition streams NAME-0.. bound to it (rabbitmq-streams "
        "add_super_stream)", arg("name"),
        arg("--partitions", type=int, help="number of partitions (default 3); not with "
            "--routing-keys"),
        arg("--routing-keys", help="comma-separated routing keys, one partition NAME-KEY "
            "each; not with --partitions"),
        arg("--max-length-bytes", type=int, help="each partition's size limit (bytes)"),
        arg("--max-age", help="each partition's age limit, as x-max-age: 7D, 12h"),
        arg("--stream-max-segment-size-bytes", type=int),
        arg("--initial-cluster-size", type=int),
        arg("--leader-locator", choices=["client-local", "balanced", "random",
                                         "least-leaders"]))
    add("delete_super_stream", cmd_delete_super_stream, "delete a super stream: its "
        "exchange and partition streams (rabbitmq-streams delete_super_stream)",
        arg("name"))
    add("grow", cmd_grow, "add a member on NODE to every quorum queue ('even': those with "
        "an even number of members) (rabbitmq-queues grow)", arg("node"),
        arg("strategy", choices=["all", "even"]), arg("--vhost-pattern", default=".*"),
        arg("--queue-pattern", default=".*"), arg("--errors-only", action="store_true"))
    add("shrink", cmd_shrink, "remove NODE's member from every quorum queue "
        "(rabbitmq-queues shrink)", arg("node"), arg("--errors-only", action="store_true"))
    add("delete_queue", cmd_delete_queue, "delete a queue", arg("name"),
        arg("--if-empty", action="store_true"), arg("--if-unused", action="store_true"))
    add("sync_queue", cmd_sync_queue, "copy what a mirrored queue's unsynchronised "
        "mirrors lack (in the background: the queue keeps serving)", arg("name"))
    add("cancel_sync_queue", cmd_cancel_sync_queue, "stop a mirrored queue's "
        "synchronisation", arg("name"))
    add("set_vm_memory_high_watermark", cmd_set_vm_memory_high_watermark,
        "memory alarm threshold: a fraction of RAM, or 'absolute BYTES'", arg("value"),
        arg("bytes", nargs="?"))
    add("close_connection", cmd_close_connection, "close a client connection",
        arg("name"), arg("reason", nargs="?", default="Closed via amqpctl"))
    add("promote", cmd_promote, "promote this warren standby to active (static roles: "
        "the manual failover; see docs/warren.md)")
    add("replication_status", cmd_replication_status,
        "warren role, epoch and standbys' lag")
    add("federation_status", cmd_federation_status, "federation links and their status",
        arg("--only-down", action="store_true", help="only links that are not running"))
    add("restart_federation_link", cmd_restart_federation_link,
        "restart a federation link (its id from federation_status)", arg("link_id"))
    return parser


# commands whose API paths only amqpd serves (node memory, the cluster's membership,
# quorum-queue members, the warren): against another product they would 404 or do
# something else, so they are refused with the product named
AMQPD_ONLY = frozenset({"join_cluster", "forget_cluster_node", "set_vm_memory_high_watermark",
                        "add_member", "delete_member", "add_replica", "delete_replica",
                        "grow", "shrink", "promote", "replication_status",
                        "add_super_stream", "delete_super_stream"})


def require_amqpd(c: Client, command: str) -> None:
    """Refuse an amqpd-only command when the API is another product's (RabbitMQ answers
    on 15672 too, and amqpctl with no --url goes there)."""
    overview = c.get("/api/overview")
    product = overview.get("product_name") if isinstance(overview, dict) else None
    if product != "amqpd":
        version = overview.get("product_version", "") if isinstance(overview, dict) else ""
        who = f"{product} {version}".strip() if product else "not amqpd (no product_name)"
        raise CtlError(f"{command} is an amqpd command, but the broker at {c.url}"
                       f"{c.origin} is {who}; pass --url to reach an amqpd broker",
                       EX_USAGE)


def target(args: argparse.Namespace,
           environ: Mapping[str, str] = os.environ) -> ctl_target.Target:
    """Which API to call and as whom: ``--url``/``AMQPCTL_URL`` as given (user guest by
    default), else the local broker found from its settings (ctl_target)."""
    url = args.url or environ.get("AMQPCTL_URL")
    if url:
        found = ctl_target.Target(url=url, username="guest", password="guest",
                                  pinned_cert=None, origin="")
    else:
        try:
            found = ctl_target.discover(args.config, environ)
        except ctl_target.Unreadable as exc:
            raise CtlError(str(exc), EX_NOINPUT) from None
        except ctl_target.NoApi as exc:
            raise CtlError(str(exc), EX_USAGE) from None
        except ConfigError as exc:
            raise CtlError(f"the broker's settings: {exc}", EX_DATAERR) from None
    username = args.username or environ.get("AMQPCTL_USERNAME") or found.username
    password = args.password or environ.get("AMQPCTL_PASSWORD") or found.password
    return ctl_target.Target(url=found.url, username=username, password=password,
                             pinned_cert=found.pinned_cert, origin=found.origin)


def _ssl_context(args: argparse.Namespace, found: ctl_target.Target) -> ssl.SSLContext | None:
    if not found.url.startswith("https"):
        return None
    if found.pinned_cert is not None and not args.cacert and not args.insecure:
        return ctl_target.pinned_context(found.pinned_cert)
    ctx = ssl.create_default_context(cafile=args.cacert)
    if args.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    try:
        found = target(args)
        client = Client(found.url, found.username, found.password, args.timeout,
                        _ssl_context(args, found), found.origin)
        if found.origin == ctl_target.DEFAULTS_ORIGIN:
            # nothing said which broker: say which one this is, before anything happens
            print(f"amqpctl: no --url, no amqpd config file and no AMQPD_* variables: "
                  f"using the API at {found.url} (amqpd's defaults)", file=sys.stderr)
        if getattr(args, "amqpd_only", False):  # list_* commands do not set it
            require_amqpd(client, args.command)
        return int(args.func(client, args, out))
    except CtlError as exc:
        if args.json:
            json.dump({"result": "error", "message": str(exc), "exit_code": exc.code}, out)
            out.write("\n")
        print(f"Error: {exc}", file=sys.stderr)
        return exc.code
    except (ssl.SSLError, OSError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE


if __name__ == "__main__":
    raise SystemExit(main())
