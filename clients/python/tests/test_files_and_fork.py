"""``session.files`` and ``session.fork`` against a real daemon, over the socket, HTTP and
asyncio: file round trips in several chunks, what the session's code sees, listings and
removal, escapes and limits raised as their typed errors, and clones that diverge."""

import asyncio

import pytest

from pyvisor_client import AsyncClient, HttpClient, InvalidParams, LimitExceeded, PyvisorError

# Larger than one write call's chunk (4 MiB), so that the socket client appends.
BIG = bytes(range(256)) * (5 * 4096 + 17)


def test_files_round_trip_over_the_socket(session):
    assert session.files.write("data/big.bin", BIG) == len(BIG)
    assert session.run("len(open('data/big.bin', 'rb').read())").value == str(len(BIG))
    assert session.files.read("data/big.bin") == BIG
    assert session.files.read("data/big.bin", offset=100, length=1000) == BIG[100:1100]
    assert session.files.write("notes.txt", "héllo\n") == 7
    assert session.files.write("notes.txt", "again\n", append=True) == 13
    session.run("open('made.txt', 'w').write('by the session')")
    assert session.files.read("made.txt") == b"by the session"
    names = [(entry["name"], entry["type"]) for entry in session.files.list()]
    assert names == [("data", "dir"), ("made.txt", "file"), ("notes.txt", "file")]
    assert session.files.list("data")[0]["size"] == len(BIG)
    session.files.remove("made.txt")
    assert "made.txt" not in [entry["name"] for entry in session.files.list()]


def test_escapes_and_limits_are_typed_errors(client):
    with client.create_session(limits={"file_bytes": 10}) as session:
        session.run("import os\nos.symlink('/etc', 'etc')")
        for path in ("../x", "/etc/passwd", "etc/passwd"):
            with pytest.raises(InvalidParams):
                session.files.read(path)
        with pytest.raises(LimitExceeded):
            session.files.write("big", b"x" * 11)
        assert session.files.list() == [], "neither the symlink nor the refused file is listed"


def test_files_over_http(daemon):
    http = HttpClient(daemon.http)
    with http.create_session() as session:
        assert session.files.write("up/big.bin", BIG) == len(BIG)
        assert session.files.read("up/big.bin") == BIG
        assert session.files.read("up/big.bin", offset=5, length=5) == BIG[5:10]
        assert [entry["name"] for entry in session.files.list("up")] == ["big.bin"]
        with pytest.raises(PyvisorError, match="append"):
            session.files.write("up/big.bin", b"more", append=True)
        with pytest.raises(InvalidParams):
            session.files.read("up/../../x")
        session.files.remove("up/big.bin")
        assert session.files.list("up") == []


def test_files_over_asyncio(daemon):
    async def scenario():
        async with await AsyncClient.connect(daemon.socket) as client:
            async with await client.create_session() as session:
                assert await session.files.write("a.bin", BIG) == len(BIG)
                assert await session.files.read("a.bin", offset=7) == BIG[7:]
                assert [e["name"] for e in await session.files.list()] == ["a.bin"]
                await session.files.remove("a.bin")
                assert await session.files.list() == []
    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_fork_over_the_socket_http_and_asyncio(client, daemon):
    with client.create_session() as session:
        session.run("trail = ['source']")
        left, right = session.fork(names=["py-left", "py-right"])
        assert left.created["name"] == "py-left" and left.created["pid"]
        left.run("trail.append('left')")
        assert left.run("trail").value == "['source', 'left']"
        assert right.run("trail").value == "['source']"
        assert session.run("trail").value == "['source']"
        with pytest.raises(InvalidParams):
            session.fork(count=17)
        for clone in (left, right):
            clone.close()
    http = HttpClient(daemon.http)
    with http.create_session() as session:
        session.run("n = 1")
        (clone,) = session.fork()
        assert clone.run("n + 1").value == "2"
        clone.close()

    async def scenario():
        async with await AsyncClient.connect(daemon.socket) as aclient:
            async with await aclient.create_session() as asession:
                await asession.run("k = 'a'")
                clones = await asession.fork(count=2)
                assert [(await c.run("k")).value for c in clones] == ["'a'", "'a'"]
                for c in clones:
                    await c.close()
    asyncio.run(asyncio.wait_for(scenario(), 120))
