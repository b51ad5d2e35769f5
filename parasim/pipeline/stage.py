"""A pipeline stage that is a stack of transformer layers (nn/layer.py's Stack): what the executor drives, with
zero-bubble's weight-gradient queue installed on its layers for a split backward. The lessons' pipeline runs
(examples/pipeline.py), the pp-vs-zero3 example and the training step (train/step.py) build their stages of it."""

from __future__ import annotations

from typing import Any, Callable

from ..nn import Saved
from ..nn.layer import Stack, StackWeights
from .executor import WeightGradQueue


class LayersStage(StackWeights):
    """A stage that is a stack of layers: what the executor drives."""

    def __init__(self, layers: list) -> None:
        self.stack = Stack(layers)
        self.weight_grads = WeightGradQueue()  # zero-bubble's W queue: schedule state, so the stage's own

    def forward(self, x: Any) -> tuple[Any, Any]:
        return self.stack.forward(x, Saved())

    def backward(self, cache: Any, dy: Any) -> Any:
        return self.stack.backward(cache, dy)

    def backward_input(self, cache: Any, dy: Any) -> tuple[Any, Callable[[], None]]:
        # the stage's layers share one ParallelContext: installed on it, the queue takes all their work
        with self.weight_grads.deferring([self.stack.layers[0].par]) as work:
            dx = self.stack.backward(cache, dy)

        def weights() -> None:
            for job in work:
                job()

        return dx, weights
