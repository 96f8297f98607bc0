"""The checks `anatomy profile` makes before anything is loaded (analysis/profile/checks.py, and the
Python API's own arguments in analysis/profile/api.py): every refusal one InputError naming the value
and the limit. The limits are worked out here from the model's context and the run's steps."""

from __future__ import annotations

import pytest
import torch

from anatomy import get_preset
from anatomy.analysis.profile.measure import ProfileOptions
from anatomy.analysis.profile.checks import check_run
from anatomy.analysis.profile.api import profile
from anatomy.errors import InputError

from ...inference.conftest import llama_tiny


def test_sizes_that_cannot_run_fail_first_naming_the_limit():
    config = llama_tiny().config  # max_seq_len 64
    with pytest.raises(InputError, match="--context 65 exceeds the model's context of 64"):
        check_run(config, ProfileOptions(prompt_len=8, context=65), "f32")
    with pytest.raises(InputError, match="--prompt-len 70 exceeds"):
        check_run(config, ProfileOptions(prompt_len=70), "f32")
    with pytest.raises(InputError, match=r"--context 10 is too small: --prompt-len 8 \+ 2 warm-up \+ --new-tokens 16"):
        check_run(config, ProfileOptions(prompt_len=8, context=10), "f32")
    with pytest.raises(InputError, match="--sweep batch=0: --batch-size 0 must be a positive integer"):
        check_run(config, ProfileOptions(batch=0), "f32", option="--sweep batch=0")
    with pytest.raises(InputError, match=r"needs about .* GiB \(weights .* GiB, KV cache .*\) but this machine has"):
        check_run(get_preset("llama-70b"), ProfileOptions(), "f32")


def test_a_default_context_past_the_model_says_what_it_is_made_of():
    config = llama_tiny().config  # 60 + 2 warm-up + 16 decode steps + 1 = 79 > 64
    with pytest.raises(InputError, match=r"the default --context \(--prompt-len 60 \+ 2 warm-up \+ --new-tokens 16 "
                                         r"decode steps \+ 1 need 79 cache slots\) exceeds the model's context of 64"):
        check_run(config, ProfileOptions(prompt_len=60), "f32")


def test_the_python_api_refuses_before_running():
    with pytest.raises(InputError, match="Linear has no anatomy ModelConfig"):
        profile(torch.nn.Linear(2, 2))
    with pytest.raises(InputError, match="--sweep 'batch=0': the values must be positive integers"):
        profile(llama_tiny(), sweep="batch=0")  # one string, not its characters
    with pytest.raises(InputError, match="--what-if 'kv=bf16': write SWITCH=VALUE"):
        profile(llama_tiny(), what_if="kv=bf16")
