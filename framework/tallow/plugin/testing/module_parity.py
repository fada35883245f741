"""Which layer of a model computes something else on one device than on another: each norm,
linear layer, gated activation and MoE block of ``model`` is run again, by the module of the
same name in ``ref``, on exactly the inputs it got, so that rounding does not pile up along the
layers and the first module that differs is the one to blame.

::

    from tallow.plugin.testing.module_parity import assert_modules_match

    gpu = load(dtype=torch.bfloat16, device="cuda")
    cpu = load(dtype=torch.bfloat16, device="cpu")
    assert_modules_match(gpu, cpu, prompt, rel=2e-2)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tallow.layers import CausalLM, FusedMoE, LinearBase, RMSNorm, SiluAndMul

from .model import assert_close_logits
from .paged_runner import prefill_logits

__all__ = ["assert_modules_match", "CHECKED"]

#: the kinds of module compared: they compute from their arguments alone (no cache, no step
#: context), so another copy can run them on the same arguments
CHECKED: tuple[type[nn.Module], ...] = (RMSNorm, LinearBase, SiluAndMul, FusedMoE)


def _tensors(value: Any) -> list[torch.Tensor]:  # Any: a module's output
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def _moved(value: Any, device: torch.device) -> Any:  # Any: a module's argument
    if isinstance(value, torch.Tensor):
        return value.detach().to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_moved(item, device) for item in value)
    return value


def assert_modules_match(
    model: CausalLM, ref: CausalLM, prompt: list[int], rel: float, what: str = ""
) -> int:
    """One prefill of ``prompt`` by ``model``, recording the arguments (before the call: some
    modules write into them) and outputs of every module of a :data:`CHECKED` kind; then each
    of those calls again by ``ref``'s module of the same name, on the arguments moved to
    ``ref``'s device. Asserts, in call order, that every output is within ``rel`` of its scale
    of ``ref``'s (naming the first module that is not) and returns how many calls were
    compared."""
    # Any: arguments and keyword arguments
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any], list[torch.Tensor]]] = []
    pending: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}
    cpu = torch.device("cpu")

    def before(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        pending[id(mod)] = (_moved(args, cpu), {k: _moved(v, cpu) for k, v in kwargs.items()})

    def after(name: str) -> Any:  # Any: a forward hook
        def hook(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            args, kwargs = pending.pop(id(mod))
            calls.append((name, args, kwargs, [t.detach().cpu() for t in _tensors(out)]))

        return hook

    checked = [name for name, mod in model.named_modules() if isinstance(mod, CHECKED)]
    # a module inside another checked one is compared as part of it
    outer = [n for n in checked if not any(n.startswith(f"{o}.") for o in checked if o)]
    modules = dict(model.named_modules())
    hooks = []
    for name in outer:
        hooks.append(modules[name].register_forward_pre_hook(before, with_kwargs=True))
        hooks.append(modules[name].register_forward_hook(after(name)))
    try:
        prefill_logits(model, prompt)
    finally:
        for hook in hooks:
            hook.remove()
    theirs = dict(ref.named_modules())
    device = next(ref.parameters()).device
    for name, args, kwargs, outs in calls:
        with torch.no_grad():
            moved = {k: _moved(v, device) for k, v in kwargs.items()}
            expected = _tensors(theirs[name](*_moved(args, device), **moved))
        assert len(expected) == len(outs), f"{what}: {name} returns {len(outs)} tensors"
        for i, (ours, them) in enumerate(zip(outs, expected)):
            assert_close_logits(ours.float(), them.float().cpu(), f"{what}: {name} output {i}", rel)
    return len(calls)
