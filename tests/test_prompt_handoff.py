"""The incremental prompt hand-off (incremental-prompt-handoff overlay) is token-exact.

The protocol (prompt_delta.py) on random interleaved conversations; the API side's
validation against vLLM 0.33's own ``validate_token_ids``; a real ``EngineCoreRequest``
through vLLM's msgpack encoder and decoder and our rebuild (needs_vllm); and the fail-safe:
an engine core without the overlay refuses a delta-sent request instead of serving it.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from dsv4_flash_overlays import handoff
from dsv4_flash_overlays.prompt_delta import (
    MIN_SHARED,
    DeltaError,
    Receiver,
    Sender,
    decode_delta,
    encode_delta,
)


def _conversations(rng: random.Random, n: int) -> list[tuple[int, list[int]]]:
    """(conversation, prompt) in send order: turns, edits, branches, several at once."""
    convs: list[list[int]] = [[rng.randrange(129_000) for _ in range(rng.randrange(1, 6000))]]
    out = []
    for _ in range(n):
        c = rng.randrange(len(convs) + (1 if len(convs) < 6 else 0))
        if c == len(convs):
            convs.append([rng.randrange(129_000) for _ in range(rng.randrange(1, 6000))])
        p = convs[c]
        x = rng.random()
        if x < 0.6:
            p = p + [rng.randrange(129_000) for _ in range(rng.randrange(1, 400))]
        elif x < 0.75 and len(p) > 3:
            i = rng.randrange(len(p))
            p = p[:i] + [rng.randrange(129_000)] + p[i + 1 :]
        elif x < 0.9:
            p = p[: rng.randrange(len(p) + 1)] + [rng.randrange(129_000) for _ in range(20)]
        convs[c] = p
        out.append((c, list(p)))
    return out


def test_every_prompt_is_rebuilt_exactly_over_an_ordered_channel() -> None:
    rng = random.Random(3)
    sender, receiver = Sender(), Receiver()
    deltas = 0
    for i, (_, prompt) in enumerate(_conversations(rng, 600)):
        rid = f"r{i}"
        delta, tail = sender.plan(prompt)
        # what the engine core gets: a header string and the tail, or the whole prompt
        if delta is None:
            got = prompt
        else:
            deltas += 1
            assert len(tail) == len(prompt) - delta.shared and delta.shared >= MIN_SHARED
            got = receiver.rebuild(0, decode_delta(encode_delta(delta)), list(tail))
        receiver.store(0, rid, got)
        sender.sent(rid, prompt, delta)
        assert got == prompt, i
    assert deltas > 50  # window 4, six conversations interleaved: many sends are full


def test_a_delta_the_receiver_cannot_hold_is_refused_not_guessed() -> None:
    sender, receiver = Sender(window=2), Receiver(window=2)
    base = list(range(5000))
    sender.sent("a", base, None)
    receiver.store(0, "a", base)
    delta, tail = sender.plan(base + [1, 2])
    assert delta is not None
    with pytest.raises(DeltaError, match="VLLM_INCREMENTAL_PROMPT_HANDOFF=0"):
        receiver.rebuild(1, delta, tail)  # another sender's prompts
    with pytest.raises(DeltaError):
        Receiver().rebuild(0, delta, tail)  # a receiver that never saw it


def test_a_failed_check_refuses_every_later_delta() -> None:
    receiver = Receiver()
    receiver.store(0, "a", list(range(5000)))
    sender = Sender()
    sender.sent("a", list(range(5000)), None)
    delta, tail = sender.plan(list(range(5000)) + [7])
    assert receiver.check(receiver.rebuild(0, delta, tail), list(range(5000)) + [7])
    assert not receiver.check([1, 2], [1, 3])
    with pytest.raises(DeltaError, match="refused"):
        receiver.rebuild(0, delta, tail)


def test_validated_prefix_never_covers_a_changed_id() -> None:
    handoff._validated.clear()
    a = list(range(3000))
    handoff.remember_validated(a)
    b = a[:1000] + [10**9] + a[1001:] + [5]
    assert handoff.validated_prefix(b) == 1000
    assert handoff.validated_prefix(a + [1]) == 3000
    a.append(10**9)  # a validated list that grew later: only what was validated counts
    assert handoff.validated_prefix(list(a)) == 3000
    handoff._validated.clear()


# ------------------------------------------------------------------- real vLLM 0.33


class _Renderer:
    """What validate_token_ids reads of a renderer: its tokenizer's and model's vocab."""

    tokenizer = type("Tok", (), {"max_token_id": 999})()
    model_config = type("MC", (), {"get_vocab_size": lambda self: 1000})()


@pytest.mark.needs_vllm
def test_validation_raises_what_vllm_raises_for_the_same_prompts() -> None:
    pytest.importorskip("vllm")
    from vllm.renderers.base import BaseRenderer

    def outcome(fn, ids):
        try:
            fn(_Renderer(), ids)
            return None
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    plain = BaseRenderer.validate_token_ids
    wrapped = handoff.wrap_validate(plain)
    handoff._validated.clear()
    rng = random.Random(9)
    prompt = [rng.randrange(1000) for _ in range(3000)]
    bad = 0
    for i in range(200):
        prompt = prompt + [rng.randrange(1000) for _ in range(rng.randrange(1, 50))]
        ids = list(prompt)
        if rng.random() < 0.3:
            bad += 1
            ids[rng.randrange(len(ids))] = rng.choice([-1, 1000, 5000])
        assert outcome(wrapped, ids) == outcome(plain, ids), i
    assert bad > 20
    handoff._validated.clear()


def _engine_request(rid: str, ids: list[int]):
    from vllm import SamplingParams
    from vllm.v1.engine import EngineCoreRequest

    return EngineCoreRequest(
        request_id=rid,
        prompt_token_ids=ids,
        mm_features=None,
        sampling_params=SamplingParams(max_tokens=4),
        pooling_params=None,
        arrival_time=0.0,
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
    )


@pytest.mark.needs_vllm
def test_real_engine_requests_through_msgpack_are_rebuilt_and_an_unpatched_core_refuses() -> None:
    pytest.importorskip("vllm")
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.request import Request
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    encoder, decoder = MsgpackEncoder(), MsgpackDecoder(EngineCoreRequest)
    wire: list[bytes] = []

    class Client:  # what AsyncMPClient.add_request_async does with the request: encode it
        async def add_request_async(self, request):
            wire.append(encoder.encode(request))

    send = handoff.wrap_send(Client.add_request_async, Client, rate=0.0)
    handoff.SENDER.__init__()
    handoff.RECEIVER.__init__()
    rng = random.Random(4)
    prompt = [rng.randrange(129_000) for _ in range(4000)]
    delta_seen = False
    for i in range(12):
        prompt = prompt + [rng.randrange(129_000) for _ in range(rng.randrange(1, 300))]
        req = _engine_request(f"r{i}", list(prompt))
        asyncio.run(send(Client(), req))
        assert req.prompt_token_ids == prompt and req.trace_headers is None  # given back
        got = decoder.decode(wire[-1])
        if got.prompt_token_ids is None:
            delta_seen = True
            with pytest.raises(ValueError):  # vLLM without the overlay: refused, not served
                Request.from_engine_core_request(got, None)
            got = decoder.decode(wire[-1])
        handoff.receive(got)
        assert got.prompt_token_ids == prompt and got.trace_headers is None
    assert delta_seen and handoff.SENDER.deltas >= 10


# ------------------------------------------------------------ the workers' hop (pickle)


class _New:
    """What mark() reads of vLLM's NewRequestData."""

    def __init__(self, rid: str, ids: list[int]) -> None:
        self.req_id, self.prompt_token_ids = rid, ids


class _Out:
    def __init__(self, news: list[_New]) -> None:
        self.scheduled_new_reqs = news


def _reset_worker_state() -> None:
    from dsv4_flash_overlays import worker_delta

    worker_delta.RELATIONS.clear()
    worker_delta._SENT.clear()
    worker_delta._HELD.clear()


def test_worker_prompts_pickle_as_deltas_and_unpickle_whole() -> None:
    import pickle

    from dsv4_flash_overlays import worker_delta

    _reset_worker_state()
    rng = random.Random(6)
    prompt = [rng.randrange(129_000) for _ in range(20_000)]
    sizes = []
    for i in range(10):
        rid = f"r{i}"
        if i:
            prev = prompt
            prompt = prev + [rng.randrange(129_000) for _ in range(300)]
            worker_delta.relate(rid, f"r{i - 1}", len(prev))
        out = _Out([_New(rid, list(prompt))])
        worker_delta.mark(out)
        sent = out.scheduled_new_reqs[0].prompt_token_ids
        assert isinstance(sent, list) and sent == prompt  # the engine core's view is unchanged
        data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        sizes.append(len(data))
        got = pickle.loads(data).scheduled_new_reqs[0].prompt_token_ids
        assert type(got) is list and got == prompt
    assert max(sizes[1:]) * 20 < sizes[0]  # 300 new tokens travel, not 20k
    _reset_worker_state()


def test_a_worker_without_the_named_prompt_refuses() -> None:
    import pickle

    from dsv4_flash_overlays import worker_delta

    _reset_worker_state()
    out = _Out([_New("a", list(range(5000)))])
    worker_delta.mark(out)
    pickle.loads(pickle.dumps(out))  # a worker now holds "a"
    worker_delta.relate("b", "a", 5000)
    out = _Out([_New("b", [*range(5000), 1, 2])])
    worker_delta.mark(out)
    data = pickle.dumps(out)
    worker_delta._HELD.clear()  # a worker that never saw "a"
    with pytest.raises(RuntimeError, match="VLLM_INCREMENTAL_PROMPT_HANDOFF=0"):
        pickle.loads(data)
    _reset_worker_state()
