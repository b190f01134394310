"""The fast greedy decoder (`trainer/evaluation/decode.py`) gives `generate`'s tokens on the tiny model, left
padding and early ends included; and the evaluation's thinking gives the same text through either path."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trainer.evaluation import decode, evaluate  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tiny_dir: str):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    model.eval()
    return model, tokenizer


PROMPTS = ["the quick brown fox", "a", "entity: Acme Corp in the year of the long tenant label set"]


def _generate(model, enc, new: int, stop: list[int], pad: int) -> list[list[int]]:
    out = model.generate(**enc, max_new_tokens=new, do_sample=False, eos_token_id=stop, pad_token_id=pad)
    return out[:, enc["input_ids"].shape[1] :].tolist()


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_greedy_tokens_equal_generate(tiny, attention: str) -> None:
    model, tokenizer = tiny
    model.set_attn_implementation(attention)
    tokenizer.padding_side = "left"
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    assert (enc["attention_mask"] == 0).any(), "the batch must hold left padding"
    new = 20
    expected = _generate(model, enc, new, [-1], tokenizer.pad_token_id)  # no stop: every token compared
    got = decode.greedy(model, enc["input_ids"], enc["attention_mask"], new, set())
    assert got is not None
    assert got.tolist() == expected


@pytest.mark.parametrize("per", [1, 2])
def test_a_prefill_in_chunks_of_rows_gives_the_same_tokens(
    tiny, monkeypatch: pytest.MonkeyPatch, per: int
) -> None:
    """The prompts go through the model a chunk of rows at a time (one row, two, the last chunk short):
    each row's tokens are still generate's."""
    model, tokenizer = tiny
    model.set_attn_implementation("sdpa")
    tokenizer.padding_side = "left"
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    expected = _generate(model, enc, 8, [-1], tokenizer.pad_token_id)
    chunks = []
    monkeypatch.setattr(decode, "prefill_rows", lambda prompt: chunks.append(prompt) or per)
    got = decode.greedy(model, enc["input_ids"], enc["attention_mask"], 8, set())
    assert chunks, "the decoder must ask how many rows a chunk holds"
    assert got is not None and got.tolist() == expected


def test_greedy_stops_once_every_row_ended(tiny) -> None:
    """With the tokens each row makes first as its stop token, the loop ends at the next check, and
    each row, cut at its end, is what generate gives."""
    model, tokenizer = tiny
    model.set_attn_implementation("sdpa")
    tokenizer.padding_side = "left"
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    first = decode.greedy(model, enc["input_ids"], enc["attention_mask"], 3, set())
    stop = {int(t) for t in first[:, 1]}
    new = 3 * decode.CHECK_EVERY
    got = decode.greedy(model, enc["input_ids"], enc["attention_mask"], new, stop)
    assert got.shape[1] == decode.CHECK_EVERY < new
    pad = tokenizer.pad_token_id
    expected = _generate(model, enc, new, sorted(stop), pad)
    ends = stop | {pad}
    assert evaluate.cut_at_end(got.tolist(), ends) == evaluate.cut_at_end(expected, ends)


def test_think_same_text_either_path(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = tiny
    model.set_attn_implementation("sdpa")
    fast = evaluate.think(model, tokenizer, PROMPTS, 24)
    monkeypatch.setattr(decode, "ENABLED", False)
    slow = evaluate.think(model, tokenizer, PROMPTS, 24)
    assert fast == slow
    assert any(text for text in fast)
    calls = []
    generate = model.generate
    monkeypatch.setattr(
        model, "generate", lambda **kw: calls.append(kw["input_ids"].shape[0]) or generate(**kw)
    )
    monkeypatch.setattr(evaluate, "prefill_rows", lambda tokens: 2)  # generate over chunks of 2 rows, 1
    assert evaluate.think(model, tokenizer, PROMPTS, 24) == fast
    assert calls == [2, 1]


def test_unusable_attention_falls_back(tiny) -> None:
    model, tokenizer = tiny
    model.config._attn_implementation = "flex_attention"
    try:
        assert "attention" in decode.usable(model)
        enc = tokenizer(PROMPTS[:1], return_tensors="pt", add_special_tokens=False)
        assert decode.greedy(model, enc["input_ids"], enc["attention_mask"], 4, set()) is None
        assert decode.path().startswith("generate: attention")
    finally:
        model.set_attn_implementation("sdpa")


def test_grouped_query_attention_equals_repeated_heads() -> None:
    """One query token a row over a masked cache: the grouped heads give what repeating the cache for every
    query head gives (transformers' way), and longer queries take transformers' path."""
    gen = torch.Generator().manual_seed(0)
    b, heads, kv_heads, length, d = 3, 8, 2, 11, 16
    q = torch.randn(b, heads, 1, d, generator=gen)
    k = torch.randn(b, kv_heads, length, d, generator=gen)
    v = torch.randn(b, kv_heads, length, d, generator=gen)
    mask = torch.rand(b, 1, 1, length, generator=gen) > 0.3
    mask[:, :, :, 0] = True
    want = torch.nn.functional.scaled_dot_product_attention(
        q,
        k.repeat_interleave(heads // kv_heads, 1),
        v.repeat_interleave(heads // kv_heads, 1),
        attn_mask=mask,
    ).transpose(1, 2)
    got, _ = decode.grouped_query_attention(None, q, k, v, mask)
    assert got.shape == (b, 1, heads, d)
    torch.testing.assert_close(got, want)


def test_steps_use_grouped_attention(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = tiny
    model.set_attn_implementation("sdpa")
    calls: list[int] = []
    real = decode.grouped_query_attention

    def counting(*args, **kwargs):
        calls.append(args[1].shape[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(decode, "grouped_query_attention", counting)
    enc = tokenizer(PROMPTS[:2], return_tensors="pt", padding=True, add_special_tokens=False)
    decode.greedy(model, enc["input_ids"], enc["attention_mask"], 5, set())
    layers = model.config.num_hidden_layers
    prompt = enc["input_ids"].shape[1]
    assert calls.count(1) == 4 * layers  # the 4 steps after the prompt, every layer
    assert calls.count(prompt) == layers  # the prefill, handed on to sdpa
    assert len(calls) == 5 * layers
    assert model.config._attn_implementation == "sdpa"  # as it was, once decoding is done
    assert decode.path() == "launched"  # no CUDA graph on the CPU


# --- a graph a GPU (`trainer/evaluation/decode_blocks.py`): what runs without a GPU --------------------


def _left_padded(tiny, new: int):
    """(the sdpa model, the left-padded prompts, generate's `new` tokens for them, no stop)."""
    model, tokenizer = tiny
    model.set_attn_implementation("sdpa")
    tokenizer.padding_side = "left"
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    return model, enc, _generate(model, enc, new, [-1], tokenizer.pad_token_id)


def test_blocks_cut_at_device_changes_and_every_n(tiny) -> None:
    from trainer.evaluation import decode_blocks

    model, _ = tiny
    layers = decode_blocks.layer_list(model)
    n = len(layers)
    assert n >= 2, "the tiny model needs two layers to cut"
    assert decode_blocks.blocks_of(layers) == [range(0, n)]  # one device: one block
    cut = decode_blocks.blocks_of(layers, split_every=1)
    assert cut == [range(i, i + 1) for i in range(n)]
    assert [i for r in cut for i in r] == list(range(n))


def test_stand_ins_give_the_layers_outputs_and_keep_block_inputs(tiny) -> None:
    """Installed, the stand-ins run the real layers block by block (recording each block's inputs on
    its device) and the model's logits do not change; afterwards the real layers are back."""
    from trainer.evaluation import decode_blocks

    model, tokenizer = tiny
    model.set_attn_implementation("sdpa")
    enc = tokenizer(PROMPTS[:1], return_tensors="pt", add_special_tokens=False)
    layers = decode_blocks.layer_list(model)
    real = list(layers)
    with torch.no_grad():
        want = model(**enc).logits
        graphs = decode_blocks.BlockGraphs(model, split_every=1)
        with graphs.installed():
            assert all(isinstance(m, decode_blocks._Stand) for m in layers)
            got = model(**enc).logits
    assert list(layers) == real
    assert torch.equal(got, want)
    first = graphs.blocks[0]
    assert first.hidden is not None and first.hidden.shape[:2] == enc["input_ids"].shape
    assert all(b.hidden is not None for b in graphs.blocks)


@pytest.mark.parametrize("split_every", [1, 2])
def test_decoding_block_by_block_gives_generates_tokens(tiny, split_every: int, monkeypatch) -> None:
    """The blocks' path (a graph a GPU on CUDA) with each block's layers run on its own buffers from the
    second step on: every step's positions, mask and cache slot must reach them, or tokens drift."""
    from trainer.evaluation import decode_blocks

    new = 20
    model, enc, expected = _left_padded(tiny, new)
    monkeypatch.setattr(decode_blocks, "SPLIT_EVERY", split_every)
    monkeypatch.setattr(decode, "_failed", [])
    monkeypatch.setattr(decode, "_graph_failed", [])
    got = decode.greedy(model, enc["input_ids"], enc["attention_mask"], new, set())
    assert decode.path() == "graphs per GPU"
    assert got.tolist() == expected


def test_a_capture_that_fails_leaves_the_layers_and_the_tokens(tiny, monkeypatch) -> None:
    """A block that cannot be captured: the real layers go back, the steps are launched one by one from
    the step recorded, and the tokens are still generate's."""
    from trainer.evaluation import decode_blocks

    new = 12
    model, enc, expected = _left_padded(tiny, new)
    layers = decode_blocks.layer_list(model)
    real = list(layers)

    def fail(self) -> None:
        raise RuntimeError("capture not permitted")

    monkeypatch.setattr(decode_blocks, "SPLIT_EVERY", 1)
    monkeypatch.setattr(decode_blocks.BlockGraphs, "capture", fail)
    monkeypatch.setattr(decode, "_failed", [])
    monkeypatch.setattr(decode, "_graph_failed", [])
    got = decode.greedy(model, enc["input_ids"], enc["attention_mask"], new, set())
    assert decode.path() == "launched"
    assert decode._graph_failed and "capture not permitted" in decode._graph_failed[0]
    assert list(layers) == real
    assert got.tolist() == expected


def test_a_replay_that_fails_decodes_the_batch_again_launched(tiny, monkeypatch) -> None:
    """Graphs that fail once replaying: the batch is decoded again with its steps launched one by one
    (generate's tokens, said once), and the fast path stays on for the batches after."""
    from trainer.evaluation import decode_blocks

    new = 12
    model, enc, expected = _left_padded(tiny, new)

    def fail(static, value) -> None:
        raise RuntimeError("replay failed")

    monkeypatch.setattr(decode_blocks, "SPLIT_EVERY", 1)
    monkeypatch.setattr(decode_blocks, "_load", fail)
    monkeypatch.setattr(decode, "_failed", [])
    monkeypatch.setattr(decode, "_graph_failed", [])
    got = decode.greedy(model, enc["input_ids"], enc["attention_mask"], new, set())
    assert got is not None and got.tolist() == expected
    assert decode.path() == "launched" and decode._failed == []
    assert "replay failed" in decode._graph_failed[0]
    assert all(not isinstance(m, decode_blocks._Stand) for m in decode_blocks.layer_list(model))


def test_a_block_input_that_changes_shape_is_refused() -> None:
    from trainer.evaluation import decode_blocks

    with pytest.raises(ValueError, match="changed shape"):
        decode_blocks._load(torch.zeros(2, 3), torch.zeros(3, 3))


def test_stand_ins_are_removed_when_a_step_fails(tiny) -> None:
    from trainer.evaluation import decode_blocks

    model, _ = tiny
    layers = decode_blocks.layer_list(model)
    real = list(layers)
    graphs = decode_blocks.BlockGraphs(model)
    with pytest.raises(RuntimeError, match="boom"), graphs.installed():
        raise RuntimeError("boom")
    assert list(layers) == real


def test_a_layer_on_another_device_reads_the_slot_from_its_own_copy() -> None:
    """StaticKV gives a layer on another device the slot through a buffer of its own, at one address
    from step to step (a graph reads it there); the 'meta' device stands in for a second GPU."""
    slot = torch.tensor([5])
    cache = decode.StaticKV(2, 8, slot, batch=1)
    cache.sync_slot(torch.device("cpu"))  # the slot's own device: nothing to copy
    assert cache._mirrors == {}
    assert cache._slots(torch.device("cpu"), 2).tolist() == [5, 6]
    meta = torch.device("meta")
    cache.sync_slot(meta)
    mirror = cache._mirrors[meta]
    cache.sync_slot(meta)
    assert cache._mirrors[meta] is mirror
    assert cache._slots(meta, 1).device == meta and cache._mirrors[meta] is mirror
