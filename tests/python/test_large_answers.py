"""Answers that grow with the names, past what one gRPC message holds (4 MiB): list() whole
and by pages, a watch's initial bindings, take_many, and tensorctl ls. Names are about 200
bytes long, so 25,000 of them take over 5 MiB and the tests stay quick."""

import asyncio
import json
import subprocess

import numpy as np
import pytest

import tensord
import tensord.aio
from test_tensorctl_json import TENSORCTL, ctl

MANY = 25_000
EMPTY = np.zeros(0, np.uint8)  # no buffer: quick to publish


def long_name(ns, i, fill="n"):
    return f"{ns}/{fill * 190}-{i:06d}"


def publish(client, names, tags=None):
    client.put_many([(n, EMPTY) for n in names], tags=tags)


@pytest.fixture
def many(client):
    names = [long_name("big", i) for i in range(MANY)]
    assert sum(len(n) for n in names) > 4 << 20
    publish(client, names)
    return names


def test_list_returns_every_name_once_in_order(broker, client, many):
    assert [d["name"] for d in client.list("big/")] == many
    assert [d["name"] for d in client.list()] == many
    assert [d["name"] for d in client.iter_list("big/")] == many
    assert client.list("big/none/") == []

    async def from_aio():
        aio = await tensord.aio.connect(broker.socket)
        try:
            listed = await aio.list("big/")
            page, token = await aio.list_page("big/", limit=10)
            return listed, page, token
        finally:
            await aio.close()

    listed, page, token = asyncio.run(asyncio.wait_for(from_aio(), 60))
    assert [d["name"] for d in listed] == many
    assert [d["name"] for d in page] == many[:10] and token == many[9]


def test_list_pages_are_bounded_and_go_on_after_the_last_name(client):
    many = [long_name("big", i) for i in range(12_000)]
    publish(client, many, tags={"pad": "p" * 100})  # 4096 of these entries take over 1 MiB
    page, token = client.list_page("big/")
    assert 0 < len(page) < 4096  # 1 MiB of entries comes first
    assert token == page[-1]["name"]
    assert [d["name"] for d in page] == many[:len(page)]

    before, after, gone = long_name("big", 0, "a"), long_name("big", 0, "z"), many[11_000]
    seen, token, pages = [], "", 0
    while True:
        page, token = client.list_page("big/", token, limit=1000)
        assert len(page) <= 1000
        seen += [d["name"] for d in page]
        pages += 1
        if pages == 2:  # names bound and unbound between pages
            publish(client, [before, after])
            client.delete(gone)
        if not token:
            break
    assert seen == [n for n in many if n != gone] + [after]  # in order, none twice

    with pytest.raises(tensord.InvalidArgument, match="page_token"):
        client.list_page("big/", "other/x")
    with pytest.raises(tensord.InvalidArgument, match="-1 entries"):
        client.list_page("big/", limit=-1)
    with pytest.raises(TypeError):
        client.list_page("big/", limit="10")
    assert client.list_page("big/", after) == ([], "")


def test_watch_sends_every_initial_binding(client, many):
    with client.watch("big/", initial=True) as watch:
        names = []
        while len(names) < MANY:
            event = watch.next(10.0)
            assert event is not None, f"no event after {len(names)}"
            assert event["kind"] == "bound", event["kind"]
            names.append(event["name"])
        assert names == many
        # Changes come after the initial bindings.
        publish(client, [long_name("big", 0, "z")])
        event = watch.next(10.0)
        assert (event["kind"], event["name"]) == ("bound", long_name("big", 0, "z"))


def test_take_many_answers_past_one_message_arrive_whole(client):
    names = [long_name("q", i) for i in range(4096)]
    publish(client, names, tags={"pad": "p" * 1024})  # about 5 MiB of answers
    taken = client.take_many("q/", 4096)
    assert [t.name for t in taken] == names
    assert client.list("q/") == []


def test_tensorctl_ls_lists_them_all(broker, client, many):
    assert [d["name"] for d in json.loads(ctl(broker, "ls", "big/"))] == many
    out = subprocess.run([TENSORCTL, "--socket", broker.socket, "ls", "big/"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[0] == "NAME" and len(lines) == MANY + 1
    assert [line.split()[0] for line in lines[1:]] == many
