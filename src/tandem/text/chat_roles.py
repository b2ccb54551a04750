"""The roles a chat message may have: one list, read by the API's request check, `tandem generate`
and the benchmarks' prompts files."""

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
