"""Real activations for the kernel plan's accuracy checks: each linear layer's inputs in one forward.

A kernel is held to an error bound on the inputs it will see, not on standard normal ones: a decoder's
activations have outlier channels (the FFN down projection's inputs above all) and its final hidden
states a structure of their own, and a kernel that rounds activations (to int8 per group, to bf16) is
as good or as bad as it is on them.

    samples = calibration_inputs(view)    # {"stack.blocks.0.attn.qkv.weight": [64, 576], ...}

The forward is the view's own reference one (its float or compact layers before the plan replaces
them) over a fixed sequence of token ids spread over the vocabulary (no tokenizer is needed, and the
same model always gets the same samples); every layer that saw inputs gets its first `rows` of them.
A model whose forward needs other processes (a tensor- or pipeline-parallel shard, `runs_alone =
False`) gives no samples: its plan is checked on standard normal inputs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

TOKENS = 128  # the calibration sequence's length
ROWS = 64  # rows kept per layer


def calibration_ids(vocab_size: int, length: int = TOKENS) -> Tensor:
    """[1, length] token ids, deterministic, away from the low ids where special tokens live."""
    low = min(100, vocab_size // 2)
    g = torch.Generator().manual_seed(0)
    return torch.randint(low, vocab_size, (1, length), generator=g)


@torch.inference_mode()
def calibration_inputs(view: nn.Module, names: list[str], rows: int = ROWS) -> dict[str, Tensor]:
    """{weight name: float32 inputs [<= rows, K]} of the linear layers `names` ("...weight") in one
    forward of `view` over calibration_ids."""
    if not getattr(view, "runs_alone", True):
        return {}
    seen: dict[str, Tensor] = {}
    hooks = []
    for name in names:
        module = view.get_submodule(name.removesuffix(".weight"))

        def keep(_module, args, name=name):
            if name not in seen:
                x = args[0]
                seen[name] = x.reshape(-1, x.shape[-1])[:rows].float().clone()

        hooks.append(module.register_forward_pre_hook(keep))
    try:
        length = min(TOKENS, view.config.max_seq_len)
        view(calibration_ids(view.config.vocab_size, length).to(next(view.parameters()).device))
    finally:
        for hook in hooks:
            hook.remove()
    return {name: x for name, x in seen.items() if x.shape[0] > 0}
