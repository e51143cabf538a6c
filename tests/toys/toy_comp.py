"""A staleness-compensation method added from outside psgd: ``toyhalf`` steps every push at
half the learning rate (one module, one registration)."""
from psgd.ps.compensation import Method, register
from psgd.ps.compensation.base import Compensation


class Half(Compensation):
    name = "toyhalf"

    def adjust(self, grad, lr, staleness, delay, now, read, worker=0):
        self.factor.add(0.5)
        return grad, lr * 0.5


register(Method("toyhalf", "toy_comp:Half", "a toy from outside psgd: half the learning rate",
                with_worker_momentum=True))
