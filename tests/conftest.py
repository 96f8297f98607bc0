"""Shared fixtures. The real checkpoints are loaded once per test session: HF transformers needs
about a minute to dequantize SmolLM2's GGUF, so every test that compares against it shares one."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def smollm2_gguf_path():
    from anatomy.checkpoints.registry import resolve

    return resolve("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf_path):
    """anatomy's fp32 SmolLM2-135M-Instruct, loaded from the embedded Q4_1 GGUF."""
    import anatomy

    return anatomy.load(smollm2_gguf_path)


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
