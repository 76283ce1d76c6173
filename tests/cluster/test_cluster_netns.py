"""A cluster of tensord nodes on one machine, with real processes and a real network:
etcd and three daemons (a, b, c), each in a network namespace of its own (netns_cluster.py).

Needs root (network namespaces), iproute2, etcd (Debian: etcd-server), openssl and a daemon
built with UCX (libucx-dev). Without root the tests skip and say so, as every test that
needs root does; as root without the rest they skip too, and fail with CI=true, so the
suite never shrinks silently.
"""

import json
import os
import subprocess
import threading
import time

import numpy as np
import pytest

import tensord
import netns_cluster
from netns_cluster import Cluster, digest, seeded, sh, wait_for

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
TENSORCTL = os.path.join(os.path.dirname(os.path.dirname(os.environ.get("TENSORD_BIN", ""))), "client", "cli",
                         "tensorctl")
LEASE_TTL_S = 10  # the daemon's default etcd lease


def _require():
    why = netns_cluster.missing()
    if why is None:
        return
    # Not root: skipped, as every test that needs root is. Root without the tools: in CI a
    # failure, so the suite never shrinks silently.
    if IN_CI and os.geteuid() == 0:
        pytest.fail(f"CI: the cluster tests cannot run: {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def cluster():
    _require()
    cluster = Cluster()
    yield cluster
    cluster.close()


@pytest.fixture(autouse=True)
def every_daemon_alive(request):
    """Each test starts and ends with every daemon it did not kill itself alive."""
    if "cluster" not in request.fixturenames:
        yield
        return
    cluster = request.getfixturevalue("cluster")
    cluster.check_alive()
    yield
    cluster.check_alive()


def get_eventually(client, name, predicate, timeout=30):
    """Gets `name` until predicate(its bytes) holds; returns a copy of those bytes."""
    def attempt():
        try:
            tensor = client.get(name)
        except (tensord.NotFound, tensord.Unavailable):
            return None
        value = np.from_dlpack(tensor).copy()
        tensor.release()
        return (value,) if predicate(value) else None
    return wait_for(attempt, timeout, f"{name} as expected")[0]


def host_bytes_in_use(client):
    """Host memory that holds tensors; a buffer waiting in a recycling pool (given back
    before an allocation would fail) does not count."""
    status = client.status()
    return status["host_bytes_in_use"] - status["host_bytes_pooled"]


def test_publish_on_one_node_acquire_on_another(cluster):
    a, b = cluster.nodes["a"].client(), cluster.nodes["b"].client()
    pulled_before, served_before = b.status()["cluster"], a.status()["cluster"]
    data = seeded(64 << 20, 1)
    a.put("shared/batch", data)
    # The publish reaches the directory just after put() returns: a reader on another node
    # that may run ahead waits for the name.
    with b.get("shared/batch", timeout=30) as got:
        assert digest(np.from_dlpack(got)) == digest(data)
        tags = got.info["tags"]
        assert tags["tensord.cluster.node"] == "a", tags
    # The replica is b's own now: a second acquire is local, and it holds b's memory.
    with b.get("shared/batch") as again:
        assert digest(np.from_dlpack(again)) == digest(data)
    assert host_bytes_in_use(b) >= 64 << 20
    # The owner held the tensor for the read only: no lease of a's is left.
    wait_for(lambda: cluster.nodes["a"].cluster_leases() == 0, 15, "a's read leases released")
    # The status says so: b pulled once, a served one read, and both are joined.
    pulled, served = b.status()["cluster"], a.status()["cluster"]
    assert (pulled["node"], pulled["joined"], pulled["etcd_endpoint"]) == ("b", True, cluster.etcd.url), pulled
    assert pulled["namespaces"] == ["shared", "weights"], pulled
    assert pulled["pulls"] == pulled_before["pulls"] + 1, (pulled_before, pulled)
    assert pulled["bytes_pulled"] - pulled_before["bytes_pulled"] >= 64 << 20, (pulled_before, pulled)
    assert pulled["replicas"] >= 1 and pulled["pulls_failed"] == pulled_before["pulls_failed"], pulled
    assert served["reads_served"] == served_before["reads_served"] + 1, (served_before, served)
    assert served["bytes_served"] - served_before["bytes_served"] == pulled["bytes_pulled"] - pulled_before["bytes_pulled"]
    assert served["reads_open"] == 0 and served["names_recorded"] >= 1, served


def test_tensorctl_status_shows_the_node_in_its_cluster(cluster):
    node = cluster.nodes["a"]
    if not os.path.exists(TENSORCTL):
        pytest.fail(f"no tensorctl at {TENSORCTL}: it is found beside $TENSORD_BIN's build tree")
    text = subprocess.run([TENSORCTL, "--socket", node.socket, "status"], capture_output=True, text=True, check=True)
    assert f"cluster      node a at {node.ip}:7411, sharing shared,weights; joined (etcd {cluster.etcd.url})" \
        in text.stdout, text.stdout
    out = subprocess.run([TENSORCTL, "--socket", node.socket, "--json", "status"], capture_output=True, text=True,
                         check=True)
    status = json.loads(out.stdout)["cluster"]
    assert (status["node"], status["joined"], status["listen"]) == ("a", True, f"{node.ip}:7411"), status


def test_names_outside_the_shared_namespaces_stay_on_their_node(cluster):
    a, b = cluster.nodes["a"].client(), cluster.nodes["b"].client()
    a.put("local/x", np.arange(10, dtype=np.int64))
    with pytest.raises(tensord.NotFound):
        b.get("local/x")
    with pytest.raises(tensord.NotFound, match="no node of the cluster has published"):
        b.get("shared/never-published")


def test_a_new_publish_on_the_owner_reaches_the_other_nodes(cluster):
    a, c = cluster.nodes["a"].client(), cluster.nodes["c"].client()
    a.put("weights/w", np.full(1 << 20, 1, dtype=np.float32))
    first = get_eventually(c, "weights/w", lambda v: v[0] == 1)
    assert first.sum() == 1 << 20
    a.put("weights/w", np.full(1 << 20, 2, dtype=np.float32))
    get_eventually(c, "weights/w", lambda v: v[0] == 2)
    # A publish on c takes the name over everywhere, a included.
    c.put("weights/w", np.full(1 << 20, 3, dtype=np.float32))
    get_eventually(a, "weights/w", lambda v: v[0] == 3)


def test_a_waiting_acquire_is_granted_by_a_publish_on_another_node(cluster):
    a, b = cluster.nodes["a"].client(), cluster.nodes["b"].client()
    result = {}

    def wait():
        with b.get("shared/later", timeout=20) as got:
            result["digest"] = digest(np.from_dlpack(got))

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)
    data = seeded(1 << 20, 7)
    a.put("shared/later", data)
    waiter.join(25)
    assert result.get("digest") == digest(data)


def test_concurrent_acquires_share_one_pull(cluster):
    a = cluster.nodes["a"].client()
    data = seeded(32 << 20, 3)
    a.put("shared/popular", data)
    time.sleep(0.5)  # recorded in the directory
    node_b = cluster.nodes["b"]
    clients = [node_b.client() for _ in range(4)]
    digests = []
    pulls_before = node_b.log().count("pulled shared/popular")

    def get(client):
        with client.get("shared/popular") as got:
            digests.append(digest(np.from_dlpack(got)))

    threads = [threading.Thread(target=get, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert digests == [digest(data)] * 4
    assert node_b.log().count("pulled shared/popular") - pulls_before == 1, node_b.log()[-3000:]


def test_a_watch_on_one_node_sees_publishes_on_another(cluster):
    a, b = cluster.nodes["a"].client(), cluster.nodes["b"].client()
    with b.watch("weights/watched/") as watch:
        time.sleep(0.3)
        a.put("weights/watched/w", np.full(16, 4, dtype=np.int32))
        event = watch.next(timeout=15)
        assert event is not None and event["kind"] == "bound" and event["name"] == "weights/watched/w", event
        # The watcher's node has a replica already: the get that follows is local.
        with b.get("weights/watched/w") as got:
            assert np.from_dlpack(got).sum() == 64
        a.delete("weights/watched/w")
        event = watch.next(timeout=15)
        assert event is not None and event["kind"] == "unbound", event


def test_a_queue_shared_by_three_nodes_hands_out_each_item_once(cluster):
    clients = {letter: node.client() for letter, node in cluster.nodes.items()}
    items = 24
    for i in range(items):
        clients["a" if i % 2 else "c"].put(f"shared/jobs/{i:03d}", np.array([i], dtype=np.int64))
    time.sleep(0.5)  # recorded in the directory
    taken = {letter: [] for letter in clients}

    def take_all(letter):
        client, misses = clients[letter], 0
        while misses < 3:
            try:
                with client.take("shared/jobs/") as tensor:
                    taken[letter].append(int(np.from_dlpack(tensor)[0]))
                misses = 0
            except tensord.NotFound:
                misses += 1
                time.sleep(0.2)

    # Node b published nothing: its takes move items from a and c, one at a time.
    for _ in range(6):
        with clients["b"].take("shared/jobs/") as tensor:
            taken["b"].append(int(np.from_dlpack(tensor)[0]))
    # Then every node takes at once, b with two takers, until nothing is left anywhere.
    threads = [threading.Thread(target=take_all, args=(letter,)) for letter in ("b", "a", "b", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    every = sorted(sum(taken.values(), []))
    assert every == list(range(items)), taken


def test_a_waiting_take_gets_what_another_node_publishes(cluster):
    a, b = cluster.nodes["a"].client(), cluster.nodes["b"].client()
    result = {}

    def wait():
        with b.take("shared/work/", timeout=20) as got:
            result["value"] = int(np.from_dlpack(got)[0])
            result["name"] = got.name

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)
    a.put("shared/work/one", np.array([42], dtype=np.int64))
    waiter.join(25)
    assert result == {"value": 42, "name": "shared/work/one"}
    with pytest.raises(tensord.NotFound):
        a.take("shared/work/one")


def test_a_reader_killed_mid_pull_leaves_nothing_on_the_owner(cluster):
    owner, reader = cluster.nodes["a"], cluster.nodes["b"]
    a, b = owner.client(), reader.client()
    a.put("shared/slow", seeded(64 << 20, 13))
    time.sleep(0.5)  # recorded in the directory
    sh("ip", "netns", "exec", owner.ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "40mbit",
       "burst", "64kb", "latency", "400ms")
    try:
        pulls_started = reader.log().count("pulling shared/slow")
        failed = []

        def acquire():
            try:
                b.get("shared/slow").release()
            except tensord.Error as error:
                failed.append(error)

        thread = threading.Thread(target=acquire)
        thread.start()
        wait_for(lambda: reader.log().count("pulling shared/slow") > pulls_started, 20, "the pull starts")
        assert owner.cluster_leases() == 1  # the read's
        reader.kill()
        thread.join(30)
        assert failed, "the reader's client saw its daemon die"
        # b leaves the directory with its lease; a ends b's reads then.
        wait_for(lambda: owner.cluster_leases() == 0, LEASE_TTL_S + 8, "a releases the dead reader's lease")
        assert "node b left the directory" in owner.log()
    finally:
        sh("ip", "netns", "exec", owner.ns, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        reader.start()


def test_a_broker_without_a_certificate_of_the_cluster_is_refused(cluster):
    pytest.importorskip("grpc")
    target = f"{cluster.nodes['a'].ip}:7411"

    def run_in_namespace_b(code):
        # A client from node b's namespace, as another broker would connect.
        return subprocess.run(["ip", "netns", "exec", cluster.nodes["b"].ns, "/usr/bin/python3", "-c", code],
                              capture_output=True, text=True, timeout=30)

    rogue_cert, rogue_key = cluster.certs.sign("rogue-node", cluster.nodes["b"].ip, ca="rogue-ca")
    b_cert, b_key = cluster.nodes["b"].cert, cluster.nodes["b"].key
    code = f"""
import grpc
def ready(creds):
    channel = grpc.secure_channel({target!r}, creds)
    try:
        grpc.channel_ready_future(channel).result(timeout=3)
        return True
    except grpc.FutureTimeoutError:
        return False
ca = open({cluster.certs.path('ca.crt')!r}, 'rb').read()
pair = lambda c, k: dict(private_key=open(k, 'rb').read(), certificate_chain=open(c, 'rb').read())
print('none', ready(grpc.ssl_channel_credentials(root_certificates=ca)))
print('rogue', ready(grpc.ssl_channel_credentials(root_certificates=ca, **pair({rogue_cert!r}, {rogue_key!r}))))
print('member', ready(grpc.ssl_channel_credentials(root_certificates=ca, **pair({b_cert!r}, {b_key!r}))))
"""
    out = run_in_namespace_b(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["none", "False", "rogue", "False", "member", "True"], out.stdout


def test_peers_checked_for_one_name_instead_of_their_address(cluster):
    """--cluster-peer-name: a node whose certificate names no address (a pod's, made before
    the pod had one) serves and reads where every node checks peers for the shared name;
    a node that checks addresses refuses it."""
    d = cluster.nodes.get("d") or cluster.add_node("d")
    d.cert, d.key = cluster.certs.sign("node-d-nameonly", None, dns=netns_cluster.PEER_NAME)
    d.start(extra=("--cluster-peer-name", netns_cluster.PEER_NAME))
    try:
        a, dc = cluster.nodes["a"].client(), d.client()
        a.put("shared/for-d", np.arange(4096, dtype=np.int64))
        # d checks a for the name, which a's certificate carries: it reads.
        with dc.get("shared/for-d", timeout=30) as got:
            assert int(np.from_dlpack(got).sum()) == 4096 * 4095 // 2
        # a checks d's address, which d's certificate does not name: the read is refused.
        dc.put("shared/from-d", np.ones(16))
        time.sleep(0.5)  # recorded in the directory
        with pytest.raises(tensord.Unavailable, match="node d"):
            a.get("shared/from-d")
    finally:
        d.stop()
        d.killed = True  # stopped on purpose


def test_a_node_given_several_etcd_endpoints_passes_over_one_that_is_down(cluster):
    """--cluster-etcd with two endpoints, the first with nothing behind it: the node joins
    through the second, serves and reads."""
    d = cluster.nodes.get("d") or cluster.add_node("d")
    d.cert, d.key = cluster.certs.sign("node-d", d.ip, dns=netns_cluster.PEER_NAME)
    down = f"https://{cluster.network.host_ip}:23791"
    d.start(etcd=f"{down},{cluster.etcd.url}")
    try:
        assert f"{down} did not answer; calls go to {cluster.etcd.url} now" in d.log()
        a, dc = cluster.nodes["a"].client(), d.client()
        a.put("shared/for-d-members", np.arange(1024, dtype=np.int64))
        with dc.get("shared/for-d-members", timeout=30) as got:
            assert int(np.from_dlpack(got).sum()) == 1024 * 1023 // 2
        dc.put("shared/from-d-members", np.full(64, 7, dtype=np.int32))
        with a.get("shared/from-d-members", timeout=30) as got:
            assert int(np.from_dlpack(got).sum()) == 7 * 64
    finally:
        d.stop()
        d.killed = True  # stopped on purpose


def test_a_cuda_tensor_crosses_nodes_through_the_staging_helpers(cluster):
    """Two daemons over the software CUDA stand-in (tests/fake_cuda: the plumbing, not a
    GPU): a CUDA tensor published on e is acquired on f as a CUDA tensor with the same
    values. Each daemon starts its staging helper (tensord-stage, found beside it)."""
    fake, peer = os.environ.get("TENSORD_FAKE_CUDA_PATH"), os.environ.get("TENSORD_CUDA_PEER")
    if not fake or not peer:
        pytest.skip("this build has no software CUDA stand-in (no cuda.h when it was configured)")
    nodes = []
    for letter, devices in (("e", 2), ("f", 1)):  # f has no cuda:1
        node = cluster.nodes.get(letter) or cluster.add_node(letter)
        node.cert, node.key = cluster.certs.sign(f"node-{letter}", node.ip, dns=netns_cluster.PEER_NAME)
        node.start(env=(f"TENSORD_LIBCUDA={fake}", f"TENSORD_FAKE_CUDA_DEVICES={devices}"))
        nodes.append(node)
    e, f = nodes
    run = dict(env={**os.environ, "TENSORD_LIBCUDA": fake, "TENSORD_FAKE_CUDA_DEVICES": "2"}, capture_output=True,
               text=True, timeout=60)
    try:
        produced = subprocess.run([peer, "produce", e.socket, "shared/on-device", "0", "300000"], **run)
        assert produced.returncode == 0 and "published 0" in produced.stdout, produced.stdout + produced.stderr
        # The directory may be a moment behind the publish: retry what is not found yet.
        deadline = time.monotonic() + 30
        while True:
            consumed = subprocess.run([peer, "consume", f.socket, "shared/on-device", "300000"], **run)
            if consumed.returncode == 0 or "NOT_FOUND" not in consumed.stderr + consumed.stdout \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert consumed.returncode == 0, consumed.stdout + consumed.stderr
        assert "device 2 0" in consumed.stdout and "ok" in consumed.stdout.split(), consumed.stdout
        for node in nodes:
            assert "started the staging helper" in node.log(), node.log()[-2000:]
        assert "pulled shared/on-device from node e" in f.log()
        for node in nodes:
            client = tensord.connect(socket=node.socket)
            try:
                assert client.status()["cluster"]["device_copies"] == 1, client.status()["cluster"]
            finally:
                client.close()
        # A tensor on a device f does not have: refused, saying so, not "not found".
        produced = subprocess.run([peer, "produce", e.socket, "shared/on-device-1", "1", "1024"], **run)
        assert produced.returncode == 0 and "published 1" in produced.stdout, produced.stdout + produced.stderr
        deadline = time.monotonic() + 30
        while True:
            refused = subprocess.run([peer, "consume", f.socket, "shared/on-device-1", "1024"], **run)
            if "NOT_FOUND" not in refused.stdout or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert refused.returncode != 0 and "FAILED_PRECONDITION" in refused.stdout, refused.stdout + refused.stderr
        assert "cannot hold a replica" in refused.stdout, refused.stdout
    finally:
        for node in nodes:
            node.stop()
            node.killed = True  # stopped on purpose
    for node in nodes:  # the helper exits with its daemon
        assert "staging helper (pid" in node.log() and "exited with status 0" in node.log(), node.log()[-2000:]


def test_an_owner_killed_mid_pull_fails_the_acquire_and_leaks_nothing(cluster):
    owner, reader = cluster.nodes["c"], cluster.nodes["b"]
    c, b = owner.client(), reader.client()
    data = seeded(64 << 20, 11)
    c.put("shared/doomed", data)
    time.sleep(0.5)  # recorded in the directory
    before = host_bytes_in_use(b)
    # The owner's link at 40 Mbit/s: 64 MiB take some 13 s, so the kill lands mid-pull.
    sh("ip", "netns", "exec", owner.ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "40mbit",
       "burst", "64kb", "latency", "400ms")
    outcome = {}

    def acquire():
        try:
            b.get("shared/doomed").release()
            outcome["result"] = "granted"
        except tensord.Error as error:
            outcome["result"] = error

    started = time.monotonic()
    pulls_started = reader.log().count("pulling shared/doomed")
    thread = threading.Thread(target=acquire)
    thread.start()
    try:
        wait_for(lambda: reader.log().count("pulling shared/doomed") > pulls_started, 20, "the pull starts")
        time.sleep(1.5)
        owner.kill()
        thread.join(60)
        error = outcome.get("result")
        assert isinstance(error, tensord.Unavailable), error
        assert "node c" in str(error), error
        assert time.monotonic() - started < 40
        assert b.status()["cluster"]["pulls_failed"] >= 1
        # Nothing of the replica is left on b; c's names leave the directory with its lease.
        wait_for(lambda: host_bytes_in_use(b) <= before, 20, "b frees the partial replica")
        wait_for(lambda: not_found(b, "shared/doomed"), LEASE_TTL_S + 8, "c's names expire")
    finally:
        sh("ip", "netns", "exec", owner.ns, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        owner.kill()
        owner.start()


def not_found(client, name):
    """Whether no node has `name` (a dead owner's name answers UNAVAILABLE until it expires)."""
    try:
        client.get(name).release()
        return False
    except tensord.NotFound:
        return True
    except tensord.Unavailable:
        return False


def test_a_node_cut_off_loses_its_names_and_gets_them_back(cluster):
    node_c, node_b = cluster.nodes["c"], cluster.nodes["b"]
    c, b = node_c.client(), node_b.client()
    data = seeded(1 << 20, 5)
    c.put("shared/from-c", data)
    get_eventually(b, "shared/from-c", lambda v: digest(v) == digest(data))
    b.close()
    b = node_b.client()
    sh("ip", "link", "set", node_c.veth, "down")
    try:
        gone = lambda: not_found(b, "shared/from-c")  # noqa: E731
        wait_for(gone, LEASE_TTL_S + 10, "c's names expire while c is cut off")
        # Node-local work on c goes on meanwhile.
        c.put("local/still-works", np.ones(4))
        assert np.from_dlpack(c.get("local/still-works")).sum() == 4
    finally:
        sh("ip", "link", "set", node_c.veth, "up")
    # c joins again under a new lease and records its names once more.
    get_eventually(b, "shared/from-c", lambda v: digest(v) == digest(data), timeout=30)


def test_etcd_stopped_and_restarted(cluster):
    a, b = cluster.nodes["a"].client(), cluster.nodes["b"].client()
    a.put("shared/across-restart", np.arange(1000, dtype=np.int32))
    cluster.etcd.stop()
    try:
        # Node-local work is untouched; cluster acquires fail, naming the directory.
        a.put("local/during-outage", np.ones(8))
        assert np.from_dlpack(a.get("local/during-outage")).sum() == 8
        with pytest.raises(tensord.Unavailable, match="cluster directory"):
            b.get("shared/across-restart")
        # Without etcd for a whole lease TTL, a node is no longer joined, and says so.
        wait_for(lambda: not b.status()["cluster"]["joined"], LEASE_TTL_S + 10, "b's status: not joined")
    finally:
        cluster.etcd.start()
    got = get_eventually(b, "shared/across-restart", lambda v: True, timeout=30)
    assert (got == np.arange(1000, dtype=np.int32)).all()
    wait_for(lambda: b.status()["cluster"]["joined"], 20, "b's status: joined again")
