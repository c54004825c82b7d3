"""How the engine's own kernels are launched (``service/engine/fast/launch.py``)."""

from __future__ import annotations

import pytest
import torch

from service.engine.fast import launch


def test_pdl_takes_a_triton_with_its_instructions_and_launch_option(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    triton = pytest.importorskip("triton")
    assert launch.supported()  # the Triton the tests install (3.5 or later)
    # An older torch's Triton has neither: the engine then launches plainly, not failing to
    # build its kernels.
    monkeypatch.setattr(triton, "__version__", "3.3.1")
    assert not launch.supported()


def test_a_launch_asks_for_pdl_only_where_it_is_wanted() -> None:
    cpu = torch.device("cpu")
    assert launch.pdl_args(False, cpu) == {"pdl": False}
    # Off CUDA (Triton's interpreter) the kernels are built without the gdc_* instructions.
    assert launch.pdl_args(True, cpu) == {"pdl": False, "launch_pdl": True}
    assert launch.pdl_args(True, torch.device("cuda")) == {"pdl": True, "launch_pdl": True}
