"""The roles a chat message may have: one list, read by the API's request check, `tandem generate`
and the benchmarks' prompts files; and the role a chat template is given for each."""

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


def template_role(role: str) -> str:
    """Chat templates know system/user/assistant/tool; OpenAI's "developer" is a system turn (a
    template given "developer" writes a turn of that name, and some add their default system
    prompt before it)."""
    return "system" if role == "developer" else role
