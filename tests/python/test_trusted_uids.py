"""A daemon run as a dedicated user: clients refuse it unless told to trust its uid, by
connect(trusted_daemon_uids=...), $TENSORD_TRUSTED_DAEMON_UIDS or tensorctl's
--trusted-daemon-uid. Pickled clients and tensors carry no trust: their receiver trusts only
root, its own uid, what its own connect() calls named for the socket and its own
environment, so crafted pickle bytes cannot point it at an attacker's daemon. Running the
daemon as another uid needs root; those tests skip otherwise."""

import json
import multiprocessing
import os
import pickle
import shutil
import signal
import subprocess
import tempfile
import time

import numpy as np
import pytest

import mp_workers
import tensord
from conftest import run_python
from tensord import _client

DAEMON_UID = 65534  # nobody: neither root nor the test's uid
TENSORCTL = os.path.join(os.path.dirname(os.path.dirname(os.environ.get("TENSORD_BIN", ""))), "client", "cli",
                         "tensorctl")


def _as_daemon_user():
    os.setgroups([])
    os.setgid(DAEMON_UID)
    os.setuid(DAEMON_UID)


@pytest.fixture
def foreign_broker():
    """tensord running as uid 65534 in a directory of its own; yields its socket path."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the daemon runs as another uid (65534)")
    top = tempfile.mkdtemp(prefix="tensord-trust-")
    os.chmod(top, 0o755)
    directory = os.path.join(top, "run")
    os.mkdir(directory, 0o700)
    os.chown(directory, DAEMON_UID, DAEMON_UID)
    socket = os.path.join(directory, "t.sock")
    log = open(os.path.join(top, "tensord.log"), "wb")
    proc = subprocess.Popen([os.environ["TENSORD_BIN"], "--socket", socket], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, preexec_fn=_as_daemon_user)
    try:
        deadline = time.monotonic() + 20
        while not (os.path.exists(socket) and os.path.exists(socket + ".fd")):
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(log.name, "rb") as f:
                    raise RuntimeError(f"tensord did not start as uid {DAEMON_UID}: {f.read().decode()[-2000:]}")
            time.sleep(0.02)
        yield socket
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(top, ignore_errors=True)


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "TENSORD_TRUSTED_DAEMON_UIDS"}
    env.update(extra)
    return env


def test_a_daemon_of_another_uid_is_refused_unless_trusted(foreign_broker, monkeypatch):
    monkeypatch.delenv("TENSORD_TRUSTED_DAEMON_UIDS", raising=False)
    with pytest.raises(tensord.PermissionDenied, match=r"uid 65534 .*\$TENSORD_TRUSTED_DAEMON_UIDS"):
        tensord.connect(foreign_broker)
    with tensord.connect(foreign_broker, trusted_daemon_uids=[DAEMON_UID]) as client:
        client.put("t/x", np.arange(5, dtype=np.int64))
        assert client.get("t/x").numpy().tolist() == [0, 1, 2, 3, 4]


def test_the_environment_names_trusted_uids(foreign_broker):
    code = (f"import tensord\nc = tensord.connect({foreign_broker!r})\n"
            "c.put('t/env', [1, 2])\nprint(c.get('t/env').numpy().tolist())\n")
    trusted = run_python(code, _env(TENSORD_TRUSTED_DAEMON_UIDS=f"1234, {DAEMON_UID}"))
    assert trusted.returncode == 0, trusted.stderr
    assert trusted.stdout.strip() == "[1, 2]"
    refused = run_python(code, _env())
    assert refused.returncode != 0 and "PermissionDenied" in refused.stderr


def test_a_pickle_carries_no_trust_its_receiver_trusts_whom_it_does(foreign_broker, tmp_path):
    """Before, the sender's trusted uids travelled in the pickle and the receiver honoured
    them; now the receiver needs its own reason to trust the daemon's uid."""
    client = tensord.connect(foreign_broker, trusted_daemon_uids=[DAEMON_UID])
    client.put("t/p", np.full(3, 7, np.int32))
    t = client.get("t/p")
    pickles = {"client": pickle.dumps(client), "first": pickle.dumps(t), "second": pickle.dumps(t)}
    assert all(b"trusted_daemon_uids" not in data for data in pickles.values())
    path = tmp_path / "pickles"
    path.write_bytes(pickle.dumps(pickles))
    load = f"import pickle, tensord\npickles = pickle.loads(open({str(path)!r}, 'rb').read())\n"

    # Trusting no one: the client refuses on its first call, the tensor on unpickling.
    refused = run_python(load + (
        "c = pickle.loads(pickles['client'])\n"
        "for attempt in (c.list, lambda: pickle.loads(pickles['first'])):\n"
        "    try:\n        attempt()\n"
        "    except tensord.PermissionDenied as e:\n        print('refused:', e)\n"), _env())
    assert refused.returncode == 0, refused.stderr
    assert refused.stdout.count("refused:") == 2 and "uid 65534" in refused.stdout

    # Trusting the uid in its own environment (what a spawned worker inherits): the token
    # the refused receiver left alone is still good.
    def use(tensor):
        return (f"c, t = pickle.loads(pickles['client']), pickle.loads(pickles[{tensor!r}])\n"
                "print(t.numpy().tolist(), c.get('t/p').numpy().tolist())\n")

    by_environment = run_python(load + use("first"), _env(TENSORD_TRUSTED_DAEMON_UIDS=str(DAEMON_UID)))
    assert by_environment.returncode == 0, by_environment.stderr
    assert by_environment.stdout.strip() == "[7, 7, 7] [7, 7, 7]"

    # Trusting it through its own connect() for that socket.
    own = f"tensord.connect({foreign_broker!r}, trusted_daemon_uids=[{DAEMON_UID}]).close()\n"
    by_connect = run_python(load + own + use("second"), _env())
    assert by_connect.returncode == 0, by_connect.stderr
    assert by_connect.stdout.strip() == "[7, 7, 7] [7, 7, 7]"
    client.close()


def test_a_spawned_worker_trusts_the_uids_of_the_environment_it_inherits(foreign_broker, monkeypatch):
    monkeypatch.setenv("TENSORD_TRUSTED_DAEMON_UIDS", str(DAEMON_UID))
    client = tensord.connect(foreign_broker)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=mp_workers.put_from_child, args=(client, "t/spawned", results))
    child.start()
    _, values = results.get(timeout=120)
    child.join(60)
    assert child.exitcode == 0 and values == [0, 7, 14, 21, 28, 35]

    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=mp_workers.sum_received, args=(theirs,))
    child.start()
    client.put("t/sum", np.arange(10, dtype=np.float64))
    ours.send(client.take("t/sum"))
    assert ours.recv() == 45.0
    child.join(60)
    assert child.exitcode == 0
    client.close()


# The attacks: pickle bytes made to name a daemon of the attacker's uid and to say that uid
# is trusted, the way pickles made before this fix did.


class _Crafted:
    """Pickles as a call of fn(*args), whatever bytes an attacker would write by hand."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def _crafted_client(socket):
    settings = {"socket": socket, "client_name": "victim", "lease_cache": True, "lease_cache_linger": 2.0,
                "trusted_daemon_uids": (DAEMON_UID,), "allocate_ahead": False}
    return pickle.dumps(_Crafted(_client._unpickled_client, settings))


def _crafted_tensor(socket, token):
    return pickle.dumps(_Crafted(_client._unpickled_tensor, socket, token, False, (DAEMON_UID,)))


def _linked_directory(socket):
    """A root-owned directory of mode 0755 whose t.sock and t.sock.fd link to socket's: it
    passes the client's socket-directory check, so what refuses the daemon there is the
    SO_PEERCRED check of the fd channel."""
    directory = tempfile.mkdtemp(prefix="tensord-link-")
    os.chmod(directory, 0o755)
    _link(directory, socket)
    return os.path.join(directory, "t.sock")


def _link(directory, socket):
    for suffix in ("", ".fd"):
        link = os.path.join(directory, "t.sock" + suffix)
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(socket + suffix, link)


@pytest.fixture(params=["its own directory", "a link in a root directory"])
def attacker_socket(request, foreign_broker):
    """The attacker's daemon (uid 65534) by a path in its own directory (refused by the
    directory check, before connecting) or through a link (refused by SO_PEERCRED on the
    fd channel, before the HELLO)."""
    if request.param == "its own directory":
        yield foreign_broker, r"socket directory \S+ is a directory owned by uid 65534"
        return
    socket = _linked_directory(foreign_broker)
    try:
        yield socket, r"the daemon at \S+t\.sock\.fd runs as uid 65534"
    finally:
        shutil.rmtree(os.path.dirname(socket), ignore_errors=True)


def _attacker(socket, code):
    """Runs code in a process that trusts the attacker's daemon (the attacker's own view of
    it, and a witness of what the victim did there); returns what code prints, read as JSON."""
    head = f"import json, numpy as np, tensord\nc = tensord.connect({socket!r})\n"
    done = run_python(head + code, _env(TENSORD_TRUSTED_DAEMON_UIDS=str(DAEMON_UID)))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_crafted_client_naming_an_attackers_daemon_is_refused_before_a_hello(attacker_socket, monkeypatch):
    monkeypatch.delenv("TENSORD_TRUSTED_DAEMON_UIDS", raising=False)
    socket, refusal = attacker_socket
    before = _attacker(socket, "print(json.dumps(c.session_id))\n")
    victim = pickle.loads(_crafted_client(socket))
    with pytest.raises(tensord.PermissionDenied, match=refusal):
        victim.list()
    with pytest.raises(tensord.PermissionDenied, match=refusal):
        victim.put("t/stolen", np.arange(3))
    # Session ids count up by one per HELLO: none reached the daemon in between.
    assert _attacker(socket, "print(json.dumps(c.session_id))\n") == before + 1


def test_a_crafted_tensor_from_an_attackers_daemon_is_refused_and_its_token_kept(attacker_socket, monkeypatch):
    monkeypatch.delenv("TENSORD_TRUSTED_DAEMON_UIDS", raising=False)
    socket, refusal = attacker_socket
    offer = _attacker(socket, "c.put('t/bait', np.full(4, 6, np.int32))\n"
                              "print(json.dumps([c.session_id, c.hand_over(c.get('t/bait'), ttl=600)]))\n")
    session, token = offer
    with pytest.raises(tensord.PermissionDenied, match=refusal):
        pickle.loads(_crafted_tensor(socket, token))
    # No session was opened, and the token was never sent: its tensor is still there for it.
    after = _attacker(socket, f"print(json.dumps([c.session_id, c.status()['hand_overs_pending'], "
                              f"c.redeem({token!r}).numpy().tolist()]))\n")
    assert after == [session + 1, 1, [6, 6, 6, 6]]


def test_crafted_pickles_add_nothing_to_this_processs_trust(broker, foreign_broker, monkeypatch):
    """Before, a crafted Client that named the real socket and the attacker's uid wrote that
    uid into the process's trust for the socket, so later pickles of the socket trusted
    whoever served it next. Now only connect() adds trust."""
    monkeypatch.delenv("TENSORD_TRUSTED_DAEMON_UIDS", raising=False)
    real = _linked_directory(broker.socket)  # the real socket, by a path that can be taken over
    try:
        with tensord.connect(real) as plain:
            honest = pickle.dumps(plain)
        trust = dict(_client._trusted_by_socket)
        copy = pickle.loads(_crafted_client(real))
        assert copy.list() == [] and copy.status()["uid"] == os.getuid()  # the real daemon serves it
        with pytest.raises(tensord.PermissionDenied):
            pickle.loads(_crafted_tensor(foreign_broker, "token"))
        assert _client._trusted_by_socket == trust and real not in _client._trusted_by_socket

        _link(os.path.dirname(real), foreign_broker)  # the attacker's daemon takes the path over
        with pytest.raises(tensord.PermissionDenied, match="uid 65534"):
            tensord.connect(real)
        with pytest.raises(tensord.PermissionDenied, match="uid 65534"):
            pickle.loads(honest).list()
        with pytest.raises(tensord.PermissionDenied, match="uid 65534"):
            pickle.loads(_crafted_client(real)).list()
        copy.close()
    finally:
        shutil.rmtree(os.path.dirname(real), ignore_errors=True)


def test_tensorctl_trusts_a_uid_it_is_given(foreign_broker):
    if not os.path.exists(TENSORCTL):
        pytest.fail(f"no tensorctl at {TENSORCTL}: it is found beside $TENSORD_BIN's build tree")
    base = [TENSORCTL, "--socket", foreign_broker, "--json", "status"]
    refused = subprocess.run(base, capture_output=True, text=True, env=_env(), timeout=30)
    assert refused.returncode != 0 and "$TENSORD_TRUSTED_DAEMON_UIDS" in refused.stderr
    flag = subprocess.run(base + ["--trusted-daemon-uid", str(DAEMON_UID)], capture_output=True, text=True,
                          env=_env(), timeout=30)
    assert flag.returncode == 0, flag.stderr
    env = subprocess.run(base, capture_output=True, text=True, env=_env(TENSORD_TRUSTED_DAEMON_UIDS=str(DAEMON_UID)),
                         timeout=30)
    assert env.returncode == 0, env.stderr


def test_a_malformed_list_is_refused_naming_it(broker, monkeypatch):
    monkeypatch.setenv("TENSORD_TRUSTED_DAEMON_UIDS", "10001,tensord")
    with pytest.raises(tensord.InvalidArgument, match=r"\$TENSORD_TRUSTED_DAEMON_UIDS: 'tensord' is not a uid"):
        tensord.connect(broker.socket)
    # An explicit list is used instead of the environment's.
    tensord.connect(broker.socket, trusted_daemon_uids=[10001]).close()
    with pytest.raises(ValueError, match="not a uid"):
        tensord.connect(broker.socket, trusted_daemon_uids=[-1])
    with pytest.raises(TypeError, match="not a string"):
        tensord.connect(broker.socket, trusted_daemon_uids="10001")
