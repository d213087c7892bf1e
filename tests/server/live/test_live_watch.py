"""What the broadcaster tells its owner and lets it do, for the bridge between replicas
(``live/replicas.py``): when the first stream opens and the last one closes; streams held before their
first event until released; a ``resync`` for every open stream and for resumes from before it."""

from __future__ import annotations

import asyncio
import gc

from stepwatch.server.live.broadcaster import Broadcaster


def test_the_owner_hears_when_the_first_stream_opens_and_the_last_one_closes() -> None:
    async def run() -> list[bool]:
        live = Broadcaster(first_id=1)
        heard: list[bool] = []
        live.watch_handlers.append(heard.append)
        one = live.stream()
        two = live.stream()  # a second one: nothing to say
        await one.__anext__()
        await one.aclose()
        assert heard == [True]
        await two.__anext__()
        await two.aclose()
        assert heard == [True, False]
        three = live.stream()  # opened and dropped unread: counted off by its finalizer
        del three
        gc.collect()
        return heard

    assert asyncio.run(run()) == [True, False, True, False]


def test_a_held_stream_waits_before_its_first_event_until_released() -> None:
    async def run() -> None:
        live = Broadcaster(first_id=1)
        live.watch_handlers.append(lambda watched: live.hold() if watched else None)
        stream = live.stream()
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.1)
        assert not first.done(), "a held stream began"
        live.publish("job", "ns", "a", {"x": 1})  # kept for it meanwhile
        live.release()
        assert (await asyncio.wait_for(first, 1)).startswith("retry:")
        assert "id: 1\n" in await asyncio.wait_for(stream.__anext__(), 1)
        await stream.aclose()

    asyncio.run(run())


def test_a_held_stream_begins_after_hold_s_without_a_release() -> None:
    async def run() -> None:
        live = Broadcaster(first_id=1)
        live.hold_s = 0.1
        live.hold()
        stream = live.stream()
        assert (await asyncio.wait_for(stream.__anext__(), 2)).startswith("retry:")
        await stream.aclose()
        live.release()

    asyncio.run(run())


def test_a_resync_reaches_every_open_stream_before_what_follows_and_uses_no_id() -> None:
    async def run() -> None:
        live = Broadcaster(first_id=1)
        streams = [live.stream(), live.stream()]
        for stream in streams:
            await stream.__anext__()
        live.publish("job", "ns", "a", {"x": 1})
        live.resync("the others were not heard")
        live.publish("job", "ns", "a", {"x": 2})
        for stream in streams:
            told = await asyncio.wait_for(stream.__anext__(), 1)
            assert told.startswith("event: resync\n") and "the others were not heard" in told
            # id 1, queued before it, is dropped: the client reads the state after it (test_stop_streams.py)
            assert (await asyncio.wait_for(stream.__anext__(), 1)).startswith("id: 2\n")  # no id used up
            await stream.aclose()

    asyncio.run(run())


def test_a_resume_from_an_id_before_a_resync_is_told_to_resync_and_one_after_it_is_not() -> None:
    """The ring lacks what the other replicas published before the resync point: a resume from before it
    reads the state again (without the point, it would get the ring's updates as if nothing was missing)."""

    async def run() -> None:
        live = Broadcaster(first_id=1)
        for x in range(3):
            live.publish("job", "ns", "a", {"x": x})  # ids 1, 2, 3
        live.resync("gap")
        live.publish("job", "ns", "a", {"x": 3})  # id 4
        before = live.stream(last_event_id=2)
        assert (await before.__anext__()).startswith("retry:")
        told = await before.__anext__()
        assert told.startswith("event: resync\n"), told
        assert (await before.__anext__()).startswith("id: 3\n")
        await before.aclose()
        after = live.stream(last_event_id=4)
        live.publish("job", "ns", "a", {"x": 4})  # id 5
        assert (await after.__anext__()).startswith("retry:")
        assert (await asyncio.wait_for(after.__anext__(), 1)).startswith("id: 5\n")
        await after.aclose()

    asyncio.run(run())


def test_a_stream_told_to_resync_at_its_resume_is_not_told_twice() -> None:
    async def run() -> None:
        live = Broadcaster(first_id=1)
        live.publish("job", "ns", "a", {"x": 0})  # id 1
        live.hold()
        stream = live.stream(last_event_id=1)
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.05)
        live.resync("gap")  # while it was held: it resumes from before the point, and was open at it
        live.release()
        assert (await first).startswith("retry:")
        assert (await stream.__anext__()).startswith("event: resync\n")
        live.publish("job", "ns", "a", {"x": 1})
        assert (await asyncio.wait_for(stream.__anext__(), 1)).startswith("id: 2\n")
        await stream.aclose()

    asyncio.run(run())
