"""``on_llm``: the client answers the LLM calls of a session created with ``llm="client"``,
over the socket (sync and asyncio): concurrent calls answered concurrently, a failure of
on_llm raised as LlmError in the code, and a run without on_llm refused at once."""

import asyncio
import threading

from pyvisor_client import AsyncClient


def test_on_llm_answers_concurrent_calls_and_its_failures_raise_llm_error(client):
    with client.create_session(llm="client") as session:
        both_waiting = threading.Barrier(2, timeout=30)
        calls = []

        def on_llm(call):
            calls.append((call["kind"], call["prompts"]))
            if call["prompts"] == ["boom"]:
                raise RuntimeError("provider down")
            if call["kind"] == "llm":
                both_waiting.wait()  # both threads' calls are in flight at once
                return call["prompts"][0].upper()
            return {"answers": [p * 2 for p in call["prompts"]],
                    "usage": {"input_tokens": 1, "output_tokens": 2}}

        code = ("import threading\n"
                "got = {}\n"
                "def ask(p): got[p] = llm_query(p)\n"
                "ts = [threading.Thread(target=ask, args=(p,)) for p in ('a', 'b')]\n"
                "[t.start() for t in ts]; [t.join() for t in ts]\n"
                "try:\n    llm_query('boom')\nexcept LlmError as err:\n    failed = str(err)\n"
                "(got['a'], got['b'], llm_query_batched(['x', 'y']), failed)")
        result = session.run(code, on_llm=on_llm)
        assert result.ok, result
        assert result.value.startswith("('A', 'B', ['xx', 'yy'], ")
        assert "provider down" in result.value
        assert ("llm_batched", ["x", "y"]) in calls

        # Without on_llm the call fails at once instead of waiting for client_timeout_s.
        refused = session.run("try:\n    llm_query('q')\nexcept LlmError as err:\n    print(err)")
        assert "no on_llm" in refused.stdout


def test_the_async_client_answers_with_a_coroutine(daemon):
    async def run():
        client = await AsyncClient.connect(daemon.socket)
        async with client:
            session = await client.create_session(llm="client")
            async with session:
                async def on_llm(call):
                    await asyncio.sleep(0)
                    return ["echo:" + p for p in call["prompts"]]
                result = await session.run("llm_query('hi')", on_llm=on_llm)
                assert result.value == "'echo:hi'"

    asyncio.run(run())


def test_a_timed_out_execution_cancels_the_call_on_llm_is_answering(client):
    with client.create_session(llm="client") as session:
        seen = []
        done = threading.Event()

        def on_llm(call):
            # Waits for the cancel (or 60 s), as a slow provider call that checks it would.
            seen.append(call.cancelled.wait(60))
            done.set()
            return "too late"

        result = session.run("llm_query('slow')", timeout=1, on_llm=on_llm)
        assert result.status == "timeout", result
        assert done.wait(30), "on_llm never returned"
        assert seen == [True], "bridge.cancel set call.cancelled"
        # The session goes on; its next call is answered as usual.
        again = session.run("llm_query('quick')", on_llm=lambda call: "fine")
        assert again.value == "'fine'", again


def test_the_async_client_cancels_the_task_of_a_cancelled_call(daemon):
    async def run():
        client = await AsyncClient.connect(daemon.socket)
        async with client:
            session = await client.create_session(llm="client")
            async with session:
                cancelled = asyncio.Event()

                async def on_llm(call):
                    try:
                        await asyncio.sleep(60)
                    except asyncio.CancelledError:
                        cancelled.set()
                        raise
                    return "too late"

                result = await session.run("llm_query('slow')", timeout=1, on_llm=on_llm)
                assert result.status == "timeout", result
                await asyncio.wait_for(cancelled.wait(), 30)

    asyncio.run(run())
