"""The simulated card (harness.running.devmem, ``--simulate-gpu``) answers as CUDA's allocator does:
storages counted while alive (views keep them), cache kept until ``empty_cache``, a factory
refused before it allocates, the per-process cap, the card shared by processes through its file;
and torch.compile still compiles beneath it. Each test runs in a fresh process (the card's mode
stays for a process's life)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def in_process(tmp_path, body: str, size: int = 1 << 30) -> str:
    code = textwrap.dedent("""
        import torch
        from harness.running import devmem
        MIB = 1 << 20
        devmem.simulate(SIZE, __import__("pathlib").Path(DIR))
        card = devmem.simulated()
        card.track()
    """).replace("DIR", repr(str(tmp_path))).replace("SIZE", str(size)) + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_storages_are_counted_while_alive_and_cached_until_emptied(tmp_path):
    in_process(tmp_path, """
        a = torch.empty(100 * MIB, dtype=torch.uint8)
        assert card.memory_allocated() == 100 * MIB
        b = a + 1
        assert card.memory_allocated() == 200 * MIB and card.max_memory_allocated() == 200 * MIB
        view = b[10:]
        del a, b
        assert card.memory_allocated() == 100 * MIB  # the view keeps b's storage
        del view
        assert card.memory_allocated() == 0 and card.memory_reserved() == 200 * MIB
        card.empty_cache()
        assert card.memory_reserved() == 0
        card.reset_peak_memory_stats()
        assert card.max_memory_allocated() == 0
        small = torch.ones(3)  # rounded to the allocator's block
        assert card.memory_allocated() == devmem.BLOCK
    """)


def test_out_of_memory_before_a_factory_allocates_and_at_the_cap(tmp_path):
    out = in_process(tmp_path, """
        try:
            torch.zeros(64 << 30, dtype=torch.uint8)  # never allocated: the machine has less
        except torch.OutOfMemoryError as exc:
            print(str(exc).splitlines()[0])
        assert card.memory_allocated() == 0
        card.set_per_process_memory_fraction(0.25)
        x = torch.empty(200 * MIB, dtype=torch.uint8)
        try:
            y = x.repeat(2)  # 400 MiB more: past the 256 MiB cap, found after the operator ran
            print("no error")
        except torch.OutOfMemoryError as exc:
            print("cap", "Tried to allocate 0.39 GiB" in str(exc), "cap 0.25 GiB" in str(exc))
    """)
    assert out.splitlines()[0].startswith("CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total")
    assert out.splitlines()[1] == "cap True True"


def test_processes_share_the_cards_memory(tmp_path):
    """One process holds 600 MiB of a 2 GiB card: another sees less free (both contexts and those
    600 MiB used), and its request for 300 MiB, more than is left, runs out of memory."""
    hold = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time, torch
        from pathlib import Path
        from harness.running import devmem
        devmem.simulate(2 << 30, Path({str(tmp_path)!r}))
        devmem.simulated().track()
        x = torch.empty(600 << 20, dtype=torch.uint8)
        print("held", flush=True)
        sys.stdin.readline()
    """)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert hold.stdout.readline().strip() == "held"
        out = in_process(tmp_path, """
            free, total = card.mem_get_info()
            print(total - free)
            try:
                torch.empty(300 * MIB, dtype=torch.uint8)
            except torch.OutOfMemoryError:
                print("out of memory")
        """, size=2 << 30)
    finally:
        hold.communicate("\n", timeout=60)
    from harness.running.memory import CONTEXT_BYTES

    used, message = out.split("\n")[:2]
    assert int(used) >= 2 * CONTEXT_BYTES + 600 * 2**20 - 2**20  # both contexts and the other's 600 MiB
    assert message == "out of memory"


def test_torch_compile_still_compiles_beneath_the_card(tmp_path):
    out = in_process(tmp_path, """
        import torch._dynamo.utils as du
        f = torch.compile(lambda x: torch.nn.functional.rms_norm(x, (64,)) * 2)
        f(torch.randn(8, 64))
        print(du.counters["frames"]["ok"])
    """)
    assert int(out.strip()) >= 1


def test_simulating_is_refused_with_a_gpu_and_below_one_worker(tmp_path):
    import torch

    args = [sys.executable, "-m", "pytest", "harness/test_differential.py", "--backend", "torch", "-n", "0",
            "--no-report", "-k", "nothing_matches"]
    if torch.cuda.is_available():
        proc = subprocess.run(args + ["--simulate-gpu", "24GiB"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0 and "for a machine without a GPU" in proc.stderr
        pytest.skip("the rest needs a machine without a GPU")
    proc = subprocess.run(args + ["--simulate-gpu", "1GiB"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "must hold at least one worker's context" in proc.stderr
    proc = subprocess.run(args + ["--simulate-gpu", "lots"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "--simulate-gpu: not a memory size" in proc.stderr
