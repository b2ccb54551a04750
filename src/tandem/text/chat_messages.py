"""Chat messages as `tandem generate` and the benchmarks' prompts files take them, checked as the
server checks a request's: a content is a string or OpenAI's list of text parts."""

from tandem.errors import TandemError
from tandem.text.chat_roles import CHAT_ROLES


def content_text(content) -> str | None:
    """A message's content as text: a string, or a list of {"type": "text", "text": ...} parts,
    one line each (as vLLM joins them); None for anything else."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str) for part in content
    ):
        return "\n".join(part["text"] for part in content)
    return None


def checked_messages(messages) -> list[dict]:
    """The messages, each content as text. Raises TandemError for what the server refuses: no
    messages, a message without a string role or a text content, an unknown role, only empty
    content."""
    if not isinstance(messages, list) or not messages:
        raise TandemError("messages must be a non-empty list of {role, content} objects")
    checked = []
    for message in messages:
        text = content_text(message.get("content")) if isinstance(message, dict) else None
        if text is None or not isinstance(message.get("role"), str):
            raise TandemError("each message needs a string 'role' and a 'content' of text (a string or a list of "
                              f'{{"type": "text", "text": ...}} parts), got {message!r}')
        if message["role"] not in CHAT_ROLES:  # the servers refuse it with a 400
            raise TandemError(f"a message's role is {message['role']!r}: use one of {', '.join(CHAT_ROLES)}")
        checked.append({**message, "content": text})
    if not any(message["content"].strip() for message in checked):
        raise TandemError("the prompt is empty: every message has empty content")
    return checked
