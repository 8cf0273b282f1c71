"""How a host program embeds EvalSupervisor: a sync thread host and an asyncio host."""
