"""Real tensord clusters on one machine, for the cluster's tests and its benchmark.

An etcd server and tensord daemons, each daemon in a network namespace of its own, joined by
veth pairs to a bridge in the caller's namespace, where etcd listens. Everything speaks
mutual TLS with certificates made here by openssl; UCX is told UCX_TLS=tcp (between
namespaces of one machine it would pick shared memory otherwise), so the bytes cross the
veth pairs as TCP. Clients talk to each daemon through its Unix socket, as on a real node.
Needs root, iproute2, etcd, openssl and a tensord built with UCX (missing() says which).
"""

import hashlib
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np

import tensord

TENSORD_BIN = os.environ.get("TENSORD_BIN", "")
PEER_NAME = "tensord-peer"


def missing():
    """Why a cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    for tool in ("ip", "etcd", "openssl", "tc"):
        if shutil.which(tool) is None:
            return f"needs {tool} (Debian: iproute2, etcd-server, openssl)"
    if not TENSORD_BIN or not os.path.exists(TENSORD_BIN):
        return "TENSORD_BIN does not name a tensord binary"
    if "--cluster-etcd" not in subprocess.run([TENSORD_BIN, "--help"], capture_output=True, text=True).stdout:
        return "this tensord has no cluster settings"
    return None


def sh(*args, check=True, **kwargs):
    return subprocess.run(list(args), check=check, capture_output=True, text=True, **kwargs)


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


def seeded(nbytes, seed):
    return np.random.default_rng(seed).integers(0, 255, size=nbytes, dtype=np.uint8)


def digest(array):
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


class Certificates:
    """A CA, a certificate per node (its IP as subjectAltName), etcd's, and a rogue CA's."""

    KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def __init__(self, directory):
        self.dir = directory
        self._ca("ca")
        self._ca("rogue-ca")

    def _openssl(self, *args):
        sh("openssl", *args, cwd=self.dir)

    def _ca(self, name):
        self._openssl("req", "-x509", *self.KEY, "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
                      "-subj", f"/CN={name}")

    def sign(self, name, ip, ca="ca", dns=None):
        """NAME.crt and NAME.key, signed by CA, naming IP and, given, the DNS name (either may be None)."""
        names = ",".join(n for n in (ip and f"IP:{ip}", dns and f"DNS:{dns}") if n)
        self._openssl("req", *self.KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
                      "-addext", f"subjectAltName={names}")
        self._openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
                      "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-copy_extensions", "copy")
        return self.path(f"{name}.crt"), self.path(f"{name}.key")

    def path(self, name):
        return os.path.join(self.dir, name)


class Network:
    """A bridge here, and a namespace per node joined to it by a veth pair."""

    def __init__(self):
        tag = f"{os.getpid() % 100000}"
        self.prefix = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
        self.bridge = f"tdbr{tag}"
        self.namespaces = []
        self.links = []
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.links.append(self.bridge)
        # Where bridged frames pass the host's iptables (br_netfilter, loaded by dockerd,
        # which also sets the FORWARD policy to DROP), let the nodes' frames through.
        self.forward_rule = None
        try:
            with open("/proc/sys/net/bridge/bridge-nf-call-iptables") as f:
                filtered = f.read().strip() == "1"
        except OSError:
            filtered = False
        if filtered and shutil.which("iptables"):
            self.forward_rule = ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]
            sh("iptables", "-I", *self.forward_rule)
        sh("ip", "addr", "add", f"{self.prefix}.1/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        self.tag = tag

    @property
    def host_ip(self):
        return f"{self.prefix}.1"

    def add_node(self, letter, index):
        ns = f"td{self.tag}{letter}"
        outside = f"td{self.tag}{letter}x"
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        sh("ip", "link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
        self.links.append(outside)
        sh("ip", "link", "set", outside, "master", self.bridge, "up")
        ip = f"{self.prefix}.{index}"
        sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        return ns, outside, ip

    def close(self):
        if self.forward_rule:
            sh("iptables", "-D", *self.forward_rule, check=False)
        for ns in self.namespaces:
            sh("ip", "netns", "del", ns, check=False)
        for link in reversed(self.links):
            sh("ip", "link", "del", link, check=False)


class Etcd:
    def __init__(self, directory, ip, certs):
        self.dir = directory
        self.url = f"https://{ip}:23790"
        self.cert, self.key = certs.sign("etcd", ip)
        self.ca = certs.path("ca.crt")
        self.ip = ip
        self.process = None
        self.start()

    def start(self):
        log = open(os.path.join(self.dir, "etcd.log"), "a")
        self.process = subprocess.Popen(
            ["etcd", "--name", "test", "--data-dir", os.path.join(self.dir, "etcd-data"),
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", "http://127.0.0.1:23800", "--initial-advertise-peer-urls", "http://127.0.0.1:23800",
             "--initial-cluster", "test=http://127.0.0.1:23800",
             "--cert-file", self.cert, "--key-file", self.key, "--trusted-ca-file", self.ca, "--client-cert-auth"],
            stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: "ready to serve client requests" in self.log() or self.process.poll() is not None, 20,
                 "etcd serves")
        assert self.process.poll() is None, self.log()

    def log(self):
        with open(os.path.join(self.dir, "etcd.log")) as f:
            return f.read()

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


class Node:
    """A tensord daemon in its namespace; clients reach it through its Unix socket."""

    def __init__(self, cluster, letter, index):
        self.cluster = cluster
        self.name = letter
        self.ns, self.veth, self.ip = cluster.network.add_node(letter, index)
        # Every node's certificate names its address and the name peers may check instead
        # (--cluster-peer-name).
        self.cert, self.key = cluster.certs.sign(f"node-{letter}", self.ip, dns=PEER_NAME)
        self.socket = os.path.join(cluster.dir, f"{letter}.sock")
        self.log_path = os.path.join(cluster.dir, f"{letter}.log")
        self.process = None
        self.killed = False
        self.clients = []

    def start(self, extra=(), wait_joined=True, etcd=None, env=()):
        """etcd: the --cluster-etcd value (default: the cluster's one etcd); env: more
        NAME=VALUE settings for the daemon's environment."""
        self.killed = False
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "env", "UCX_TLS=tcp", "UCX_NET_DEVICES=eth0", *env, TENSORD_BIN,
             "--socket", self.socket, "--cluster-etcd", etcd or self.cluster.etcd.url, "--node-name", self.name,
             "--cluster-listen", f"{self.ip}:7411", "--cluster-namespaces", "shared,weights",
             "--cluster-ca-file", self.cluster.certs.path("ca.crt"), "--cluster-cert-file", self.cert,
             "--cluster-key-file", self.key, "--log-level", "debug", *extra],
            stdout=open(self.log_path, "a"), stderr=subprocess.STDOUT)
        marker = f"node {self.name} joined the directory"
        seen = self.log().count(marker)
        if wait_joined:
            wait_for(lambda: self.log().count(marker) > seen or self.process.poll() is not None, 20,
                     f"node {self.name} joins")
            assert self.process.poll() is None, self.log()

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def client(self):
        client = tensord.connect(socket=self.socket)
        self.clients.append(client)
        return client

    def kill(self):
        self.killed = True
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        for client in self.clients:
            client.close()
        self.clients = []

    def cluster_leases(self):
        """Leases the daemon's cluster session holds: one per read another node has open."""
        client = tensord.connect(socket=self.socket)
        try:
            sessions = client.status(sessions=True)["session_usage"]
            return sum(s["leases"] for s in sessions if s["client_name"] == "tensord-cluster")
        finally:
            client.close()

    def stop(self):
        for client in self.clients:
            client.close()
        self.clients = []
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(15)


class Cluster:
    """etcd and one node per letter (nodes[letter]), started."""

    def add_node(self, letter):
        """One more node (not started)."""
        node = Node(self, letter, 2 + len(self.nodes))
        self.nodes[letter] = node
        return node

    def __init__(self, letters="abc"):
        self.dir = tempfile.mkdtemp(prefix="tensord-cluster-")
        self.certs = Certificates(self.dir)
        self.network = Network()
        self.etcd = Etcd(self.dir, self.network.host_ip, self.certs)
        self.nodes = {letter: Node(self, letter, 2 + i) for i, letter in enumerate(letters)}
        for node in self.nodes.values():
            node.start()

    def check_alive(self):
        """Fails naming any node whose daemon exited unasked, with the end of its log."""
        for node in self.nodes.values():
            if node.process is not None and node.process.poll() is not None and not node.killed:
                tail = "\n".join(node.log().splitlines()[-40:])
                raise AssertionError(f"node {node.name}'s daemon exited ({node.process.returncode}):\n{tail}")

    def close(self):
        try:
            self.check_alive()
        except AssertionError as error:
            print(error)
        for node in self.nodes.values():
            node.stop()
        self.etcd.stop()
        self.network.close()
        if os.environ.get("TENSORD_CLUSTER_KEEP"):
            print(f"logs kept in {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
