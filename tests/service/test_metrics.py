"""The metrics endpoint (--metrics-address) of a running daemon, scraped as Prometheus does:
the exposition format parsed strictly, and the figures checked against what clients did,
including a client killed with kill -9 while it held leases."""

import http.client
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

TENSORD = os.environ.get("TENSORD_BIN", "")
TENSORCTL = os.environ.get("TENSORCTL_BIN", "")

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def parse(text):
    """Prometheus text format 0.0.4 -> {family: type}, [(name, {label: value}, float)].

    Fails on anything the format does not allow: a sample before its family's TYPE, a
    malformed line or label set, a histogram whose buckets are not cumulative or whose +Inf
    bucket is not its count."""
    assert text.endswith("\n"), "the text must end with a newline"
    types, samples, helps = {}, [], set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert name not in helps, f"a second HELP for {name}"
            helps.add(name)
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), line
            assert name not in types, f"a second TYPE for {name}"
            types[name] = kind
            continue
        assert line and not line.startswith("#"), f"unexpected line {line!r}"
        m = SAMPLE.match(line)
        assert m, f"malformed sample {line!r}"
        name, labels_text, value = m.group(1), m.group(3) or "", m.group(4)
        labels, pos = {}, 0
        while pos < len(labels_text):
            lm = LABEL.match(labels_text, pos)
            assert lm, f"malformed labels in {line!r}"
            labels[lm.group(1)] = lm.group(2)
            pos = lm.end()
        family = name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and types.get(name[: -len(suffix)]) == "histogram":
                family = name[: -len(suffix)]
        assert family in types, f"{name} has no TYPE line before it"
        assert family.startswith("tensord_"), name
        if types[family] == "counter":
            assert name.endswith("_total"), f"counter {name} must end in _total"
        samples.append((name, labels, float(value)))
    check_histograms(types, samples)
    return types, samples


def check_histograms(types, samples):
    series = {}
    for name, labels, value in samples:
        if name.endswith("_bucket"):
            key = (name[:-7], tuple(sorted((k, v) for k, v in labels.items() if k != "le")))
            series.setdefault(key, []).append((float(labels["le"]), value))
    counts = {(n[:-6], tuple(sorted(l.items()))): v for n, l, v in samples if n.endswith("_count")}
    for key, buckets in series.items():
        bounds = [b for b, _ in buckets]
        assert bounds == sorted(bounds) and bounds[-1] == math.inf, key
        values = [v for _, v in buckets]
        assert values == sorted(values), f"{key}: buckets not cumulative {values}"
        assert counts[key] == values[-1], f"{key}: +Inf bucket {values[-1]} != count {counts[key]}"


def value(samples, name, **labels):
    found = [v for n, l, v in samples if n == name and all(l.get(k) == w for k, w in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=10)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.path)


def get(connection, path="/metrics", method="GET"):
    connection.request(method, path)
    response = connection.getresponse()
    return response.status, response.getheader("Content-Type"), response.read().decode()


class Daemon:
    def __init__(self, directory, metrics):
        self.socket = os.path.join(directory, "t.sock")
        self.log_path = os.path.join(directory, "tensord.log")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([TENSORD, "--socket", self.socket, "--metrics-address", metrics],
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while "metrics: GET /metrics at" not in self.log():
            assert self.proc.poll() is None, self.log()
            assert time.monotonic() < deadline, self.log()
            time.sleep(0.02)
        self.metrics_at = re.search(r"metrics: GET /metrics at (\S+)", self.log()).group(1)

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=20) == 0


@pytest.fixture
def unix_daemon(tmp_path):
    d = Daemon(str(tmp_path), "unix:" + str(tmp_path / "metrics.sock"))
    yield d
    d.stop()


def scrape(daemon):
    if daemon.metrics_at.startswith("unix:"):
        connection = UnixHTTPConnection(daemon.metrics_at[5:])
    else:
        host, port = daemon.metrics_at.rsplit(":", 1)
        connection = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=10)
    status, content_type, body = get(connection)
    assert status == 200 and content_type == "text/plain; version=0.0.4; charset=utf-8", (status, content_type)
    return parse(body)


HOLDER = """
import sys, time, tensord
c = tensord.connect(sys.argv[1])
held = [c.get("ds/batch") for _ in range(3)]
print("holding", flush=True)
time.sleep(600)
"""


def test_scrape_reflects_clients_and_a_killed_holder(unix_daemon, tmp_path):
    np = pytest.importorskip("numpy")
    types, samples = scrape(unix_daemon)
    assert value(samples, "tensord_tensors") == 0
    assert types["tensord_rpc_duration_seconds"] == "histogram"
    assert value(samples, "tensord_device_bytes_limit", backend="host", device="host") > 0

    batch = tmp_path / "batch.npy"
    np.save(batch, np.ones((256, 1024), np.float32))  # 1 MiB
    subprocess.run([TENSORCTL, "--socket", unix_daemon.socket, "put", "ds/batch", str(batch)], check=True,
                   capture_output=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, unix_daemon.socket], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"

    _, samples = scrape(unix_daemon)
    assert value(samples, "tensord_tensors") == 1
    assert value(samples, "tensord_named_tensors") == 1
    assert value(samples, "tensord_namespace_tensors", namespace="ds", device="host") == 1
    assert value(samples, "tensord_namespace_bytes", namespace="ds", device="host") == 1 << 20
    assert value(samples, "tensord_sessions") == 1
    assert value(samples, "tensord_leases") >= 1
    assert value(samples, "tensord_rpcs_total", method="Publish", transport="session", code="OK") == 1
    assert value(samples, "tensord_rpcs_total", method="Acquire", transport="session", code="OK") >= 1
    reclaimed_before = value(samples, "tensord_leases_reclaimed_total")

    holder.kill()  # kill -9: its leases are reclaimed by the broker
    holder.wait()
    deadline = time.monotonic() + 10
    while True:
        _, samples = scrape(unix_daemon)
        if value(samples, "tensord_sessions") == 0:
            break
        assert time.monotonic() < deadline, "the killed client's session did not end"
        time.sleep(0.05)
    assert value(samples, "tensord_leases_reclaimed_total") > reclaimed_before
    assert value(samples, "tensord_leases") == 0


def test_other_paths_and_methods(unix_daemon):
    path = unix_daemon.metrics_at[5:]
    assert get(UnixHTTPConnection(path), "/")[0] == 404
    assert get(UnixHTTPConnection(path), "/metrics", "POST")[0] == 405
    status, _, body = get(UnixHTTPConnection(path), "/metrics", "HEAD")
    assert status == 200 and body == ""


def half_open(path, count, head):
    """`count` connections to the Unix socket `path`, each having sent `head` and no more."""
    connections = []
    for _ in range(count):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.sendall(head)
        connections.append(s)
    return connections


def test_silent_and_half_open_clients_do_not_stop_scrapes(unix_daemon):
    # 20 connections that send half a request head and wait: the endpoint used to serve
    # one connection at a time, 2 s each, so scrapes (10 s timeout) got nothing for 40 s.
    path = unix_daemon.metrics_at[5:]
    held = half_open(path, 20, b"GET /metr")
    silent = half_open(path, 1, b"")[0]  # sends nothing
    for _ in range(5):
        scrape(unix_daemon)
    # More connections than the endpoint keeps (64): it drops the oldest, never the scraper.
    crowd = half_open(path, 100, b"GET /")
    scrape(unix_daemon)
    first = crowd[0]
    first.settimeout(10)
    # Dropped: closed, which reads as end of file, or, when the endpoint had not read the
    # bytes sent yet, reset by the kernel (a close with unread data sends RST).
    try:
        dropped = first.recv(1) == b""
    except ConnectionResetError:
        dropped = True
    assert dropped, "the oldest of 100 half-open connections was kept"
    for s in held + crowd + [silent]:
        s.close()


def test_tcp_on_a_port_the_kernel_picks(tmp_path):
    d = Daemon(str(tmp_path), "127.0.0.1:0")
    try:
        assert re.fullmatch(r"127\.0\.0\.1:\d+", d.metrics_at), d.metrics_at
        assert not d.metrics_at.endswith(":0")
        _, samples = scrape(d)
        assert [l["version"] for n, l, v in samples if n == "tensord_info"] != []
    finally:
        d.stop()


def has_ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_no_host_serves_every_address(tmp_path):
    # ":PORT" bound 0.0.0.0 alone, while the docs promise every address.
    d = Daemon(str(tmp_path), ":0")
    try:
        port = int(d.metrics_at.rsplit(":", 1)[1])
        for host in ("127.0.0.1", "::1"):
            if host == "::1" and not has_ipv6_loopback():
                continue  # a machine without IPv6 binds IPv4's wildcard alone
            connection = http.client.HTTPConnection(host, port, timeout=10)
            status, _, body = get(connection)
            assert status == 200 and "tensord_info" in body, (host, status)
    finally:
        d.stop()


@pytest.mark.parametrize("address,why", [
    ("9464", "expected HOST:PORT"),
    ("localhost:http", "is not a number from 0 to 65535"),
    ("unix:", "needs a path"),
])
def test_a_bad_address_is_refused_naming_the_flag(address, why):
    result = subprocess.run([TENSORD, "--metrics-address", address, "--print-config"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2
    assert "--metrics-address" in result.stderr and why in result.stderr, result.stderr


def test_an_address_in_use_fails_start_up(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        result = subprocess.run([TENSORD, "--socket", str(tmp_path / "t.sock"), "--metrics-address",
                                 f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30)
    finally:
        taken.close()
    assert result.returncode == 1
    assert f"metrics endpoint: listen on metrics address 127.0.0.1:{port}" in result.stderr, result.stderr
