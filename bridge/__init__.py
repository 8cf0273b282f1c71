"""How a host program embeds EvalSupervisor: a sync thread host and an asyncio host.

Both run the supervisor on trio in a daemon thread of their own and talk to it only through
non-blocking hand-offs, so nothing the evaluations do can hang the host:

- :class:`EvalBridge`: ``with EvalBridge(config, eval_fn=...) as ev:`` for a plain training
  loop;
- :class:`AsyncEvalBridge`: ``async with AsyncEvalBridge(config, eval_fn=...) as ev:`` for an
  ``asyncio.run`` driver or a Ray driver.
"""

from bridge._async import AsyncEvalBridge
from bridge._runtime import TRIO_THREAD
from bridge._sync import EvalBridge

__all__ = ["TRIO_THREAD", "AsyncEvalBridge", "EvalBridge"]
