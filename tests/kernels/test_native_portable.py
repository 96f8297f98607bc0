"""The native kernels on any CPU. Every source compiles for aarch64 (Debian's g++-aarch64-linux-gnu, which
`make test` installs) against torch's headers with the build's flags, so the guard around the x86-64
vector code cannot rot; and on this machine $ANATOMY_NATIVE_ISA limits a whole process to the
portable loops (a CPU without AVX2) or to AVX2, with the numbers native.limited gives in this one, the
kernel plan not offering the portable loops, and a model still generating."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from anatomy.kernels import native
from anatomy.kernels.native import build
from anatomy.weights.formats import Int4Weight

pytestmark = pytest.mark.slow
CROSS = "aarch64-linux-gnu-g++"
ROOT = Path(__file__).resolve().parents[2]


def _cross_compile(source: Path) -> subprocess.CompletedProcess:
    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    return subprocess.run([CROSS, *build.FLAGS, "-w", "-fsyntax-only", *includes, str(source)], capture_output=True,
                          text=True, timeout=600)


@pytest.mark.skipif(shutil.which(CROSS) is None,
                    reason=f"no {CROSS} (Debian's g++-aarch64-linux-gnu; `make test` installs it)")
def test_every_source_compiles_for_aarch64(tmp_path):
    probe = tmp_path / "x86.cpp"
    probe.write_text("#include <immintrin.h>\n")
    assert _cross_compile(probe).returncode != 0  # the check can fail: x86 intrinsics are not there
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = dict(zip(build.SOURCES, pool.map(_cross_compile, build.SOURCES)))
    failures = {source.name: out.stderr[-3000:] for source, out in results.items() if out.returncode != 0}
    assert failures == {}


SCRIPT = """
import sys
import torch
import anatomy
from anatomy.kernels import native
from anatomy.weights.formats import Int4Weight
running, offered = native.isa(), native.available()
torch.manual_seed(0)
fmt = Int4Weight.from_float(torch.randn(67, 320) * 0.05 + 0.01, group=32)
packed = torch.ops.anatomy.pack_q4(fmt.codes, fmt.scale.float(), fmt.offset.float())
y = torch.ops.anatomy.q4_linear(torch.randn(13, 320), packed)
torch.manual_seed(0)
model = anatomy.build_model(anatomy.get_preset("llama-7b", vocab_size=96, d_model=64, n_layers=2, n_heads=4,
                                               n_kv_heads=2, d_ff=128, max_seq_len=32))
tokens = anatomy.generate(model, [1, 2, 3], max_new_tokens=4, ignore_eos=True).token_ids
torch.save({"isa": running, "offered": offered, "y": y, "tokens": len(tokens)}, sys.argv[1])
"""


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != native.ISA_ENV}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return {**env, **extra}


@pytest.mark.skipif(not native.loaded(), reason="the native library is built by make")
@pytest.mark.parametrize("isa", ["portable", "avx2"])
def test_the_environments_limit_runs_a_process_on_less(isa, tmp_path):
    if native.ISAS.index(isa) > native.ISAS.index(native.isa()):
        pytest.skip(f"this CPU has no {isa}")
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "out.pt")], capture_output=True, text=True,
                         timeout=600, env=_environment(**{native.ISA_ENV: isa}))
    assert out.returncode == 0, out.stderr
    got = torch.load(tmp_path / "out.pt", weights_only=True)
    torch.manual_seed(0)
    fmt = Int4Weight.from_float(torch.randn(67, 320) * 0.05 + 0.01, group=32)
    packed = torch.ops.anatomy.pack_q4(fmt.codes, fmt.scale.float(), fmt.offset.float())
    with native.limited(isa):
        expected = torch.ops.anatomy.q4_linear(torch.randn(13, 320), packed)
    assert got["isa"] == isa and got["offered"] == (isa != "portable") and got["tokens"] == 4
    assert torch.equal(got["y"], expected)
    assert "native kernels unavailable" not in out.stderr  # a limit the user set is not a missing piece

