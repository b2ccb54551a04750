"""The roles a chat message may have: one list, read by the API's request check and by `tandem generate`."""

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
