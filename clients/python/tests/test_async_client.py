"""The asyncio client against a real daemon: streaming with plain and coroutine callbacks,
input(), interrupts from another task, and the typed errors."""

import asyncio

import pytest

from pyvisor_client import AsyncClient, InvalidParams, UnknownSession


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 120))


def test_async_streaming_and_input_round_trip(daemon):
    async def scenario():
        async with await AsyncClient.connect(daemon.socket) as client:
            async with await client.create_session() as session:
                chunks = []

                async def answer(prompt, password):
                    return prompt.upper()

                result = await session.run(
                    "print('before')\nreply = input('who? ')\nprint(reply)",
                    on_stdout=chunks.append, on_input=answer)
                assert result.ok, result
                assert "".join(chunks) == "before\nWHO? \n"
                assert (await session.run("reply")).value == "'WHO? '"
    run(scenario())


def test_async_interrupt_from_another_task(daemon):
    async def scenario():
        async with await AsyncClient.connect(daemon.socket) as client:
            async with await client.create_session() as session:
                started = asyncio.Event()
                running = asyncio.ensure_future(session.run(
                    "import time\nprint('go', flush=True)\ntime.sleep(60)",
                    on_stdout=lambda text: started.set()))
                await started.wait()
                assert await session.interrupt() is True
                assert (await running).status == "interrupted"
    run(scenario())


def test_async_errors_and_checkpoints(daemon):
    async def scenario():
        async with await AsyncClient.connect(daemon.socket) as client:
            with pytest.raises(UnknownSession):
                await client.session("nobody-here")
            with pytest.raises(InvalidParams):
                await client.create_session(limits={"memory_mb": -1})
            async with await client.create_session() as session:
                await session.run("z = [1, 2]")
                taken = await session.checkpoint()
                await session.run("z.append(3)")
                await session.restore(taken["checkpoint_id"])
                assert (await session.run("z")).value == "[1, 2]"
                assert (await session.run("1/0", timeout=5)).error["type"] == \
                    "ZeroDivisionError"
    run(scenario())
