"""Shared fixtures. The real checkpoints are loaded once per test session: HF transformers needs
about a minute to dequantize SmolLM2's GGUF, so every test that compares against it shares one."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session", autouse=True)
def _native_notice_spent():
    """The native kernels' once-per-process notice (no library, a CPU without their vector code) is
    given before the tests, so that no test's stderr depends on which one builds the first engine
    (tests/kernels/test_native_library.py checks the notice in processes of its own). Before the plan
    cache moves: a library compiled on first use goes to the user's cache, as the test modules'
    collection puts it, not into one of this session only."""
    import warnings

    from anatomy.kernels import native

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        native.available()


@pytest.fixture(scope="session", autouse=True)
def _plan_cache(tmp_path_factory):
    """Kernel plans measured by the tests go to a directory of this session, not the user's cache."""
    from anatomy.kernels.cache import CACHE_ENV

    mp = pytest.MonkeyPatch()
    mp.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("anatomy-cache")))
    yield
    mp.undo()


# The kernels forced_timings makes the plan choose, first eligible first: anatomy's own for the rows they
# take (decode and batch; tiles where AVX-512 VNNI runs them), then a bf16 copy for prefill (the branches
# compute in bf16, as where the prefill race picks a bf16 kernel), float32 for float32 weights
FORCED_KERNELS = ("q4t", "q4t16", "q4x", "q4f", "q8t16", "l4t16", "q8x", "q8f", "q6x", "bf16", "f32")


@pytest.fixture
def forced_timings(monkeypatch, tmp_path_factory):
    """Every timing decision the engine makes answered as if anatomy's native kernel won, whatever this
    machine's timings say: the kernel plan's per layer (ranked by FORCED_KERNELS; the accuracy checks
    still run), the fused decode block against the torch block, the native decode and prompt attention
    against SDPA; the plan kept in a fresh directory (no decision measured elsewhere is reused, none made here kept)."""
    from anatomy.kernels import attention, decode_block, timing
    from anatomy.kernels.cache import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("forced-plan")))
    monkeypatch.setattr(timing, "_time", _forced_times)
    monkeypatch.setattr(decode_block, "faster", lambda *args, **kwargs: True)
    monkeypatch.setattr(attention, "_native_faster", lambda *args: True)
    monkeypatch.setattr(attention, "_causal_faster", lambda *args: True)


@pytest.fixture
def native_forced(forced_timings):
    """The engine's native paths (the fused decode blocks, anatomy's kernels, its decode attention),
    forced; skipped, with the reason, where the CPU runs no vector path of the native kernels."""
    from anatomy.kernels import native

    if not native.available():
        why = "is not built" if not native.loaded() else f"runs only its portable loops here (ISA {native.isa()})"
        pytest.skip(f"the native decode path needs the native library on AVX2 or better: it {why}")


def _forced_times(entries, repeats: int) -> dict:
    """kernels.timing._time's answer ({kernel: (seconds, spread)}) ranked by FORCED_KERNELS, nothing run."""
    from anatomy.kernels.candidates import KERNELS

    order = FORCED_KERNELS + tuple(k.name for k in KERNELS if k.name not in FORCED_KERNELS)
    return {kernel.name: ((order.index(kernel.name) + 1) * 1e-6, 0.0) for kernel, _, _ in entries}


@pytest.fixture(scope="session")
def int4_tiny(tmp_path_factory):
    """A tiny random LLaMA-style decoder saved and loaded with weights="int4" (compact int4 matrices),
    one per session, so that the kernel plan its engines measure is measured once."""
    import anatomy
    from anatomy import build_model, get_preset

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("hf") / "llama"
    anatomy.save(build_model(get_preset("llama-7b", vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                        d_ff=128, max_seq_len=32)), path)
    return anatomy.load(path, weights="int4")


def tiny_chat_model(hf_dir, gguf_path, *, d_model: int = 32, max_seq_len: int = 128):
    """A tiny random LLaMA-style decoder with SmolLM2's tokenizer (so it has a chat template), saved
    as an HF directory (with tokenizer.json) and as a GGUF file; returns the model."""
    import anatomy

    tok = anatomy.load_tokenizer("smollm2-135m-instruct")
    torch.manual_seed(0)
    model = anatomy.build_model(anatomy.get_preset(
        "llama-7b", vocab_size=tok.vocab_size, d_model=d_model, n_heads=2, n_kv_heads=1, n_layers=2, d_ff=2 * d_model,
        max_seq_len=max_seq_len, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)).eval()
    anatomy.save(model, hf_dir)
    tok.save(hf_dir)
    anatomy.save(model, gguf_path, tokenizer=tok)
    return model


@pytest.fixture(scope="session")
def smollm2_gguf_path():
    from anatomy.checkpoints.registry import resolve

    return resolve("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf_path):
    """anatomy's fp32 SmolLM2-135M-Instruct (every weight dequantized), from the embedded Q4_1 GGUF."""
    import anatomy

    return anatomy.load(smollm2_gguf_path, weights="f32")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf_path):
    import anatomy

    return anatomy.load_tokenizer(smollm2_gguf_path)


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf_path):
    """HF transformers' LlamaForCausalLM from the same GGUF (HF dequantizes it itself): the reference."""
    from transformers import AutoModelForCausalLM

    path = smollm2_gguf_path
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, torch_dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def hf_smollm2_tokenizer(smollm2_gguf_path):
    from transformers import AutoTokenizer

    path = smollm2_gguf_path
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="session")
def greedy():
    """greedy(model, ids, n, eos=None) -> the n (or fewer, stopping after eos) greedy next tokens of
    an anatomy DecoderLM: one prefill, then one token per step through a static KV cache."""
    from anatomy.inference.engine.kv_cache import KVCache

    @torch.no_grad()
    def run(model, ids: list[int], n: int, eos: int | None = None) -> list[int]:
        cache = KVCache(model.config, batch=1, max_len=len(ids) + n)
        logits = model(torch.tensor([ids]), cache=cache, input_pos=torch.arange(len(ids)), last_only=True)
        out: list[int] = []
        while len(out) < n:
            out.append(int(logits[0, -1].argmax()))
            if out[-1] == eos or len(out) == n:
                break
            pos = torch.tensor([len(ids) + len(out) - 1])
            logits = model(torch.tensor([[out[-1]]]), cache=cache, input_pos=pos, last_only=True)
        return out

    return run


@pytest.fixture
def fused_steps(monkeypatch) -> list[bool]:
    """A list that gets, for every NativeBlock call, whether the native operator computed it (True) or
    the block it stands for did (the operator declined: more rows, a span, ...)."""
    from anatomy.kernels.decode_block import NativeBlock

    computed: list[bool] = []
    own_step = NativeBlock._step

    def step(self, x, ctx, cache):
        inputs = own_step(self, x, ctx, cache)
        computed.append(inputs is not None)
        return inputs

    monkeypatch.setattr(NativeBlock, "_step", step)
    return computed
