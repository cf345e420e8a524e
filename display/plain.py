"""Text from users, agents and runs made safe to show on a terminal: no control characters.

A goal's text, an agent's question or note, a Slack user's message, a run's log: any of them may
hold ESC or CSI, and a terminal obeys those (colours, a rewritten screen, a window title, on some
terminals an answer typed back as if by the user). Newlines and tabs stay; a carriage return ends a
line (a progress bar's redraws read as lines); every other C0 control, DEL and the C1 controls
(U+0080-U+009F, which some terminals take as ESC sequences) go. Standard library only: the CLI's
quick verbs import this."""

# C0 but tab and newline (a carriage return is handled apart), DEL, C1.
_CONTROL = dict.fromkeys([*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0)])


def clean(text: str) -> str:
    """`text` without control characters; CRLF and lone CR read as line ends."""
    if text.isprintable():  # the usual case, one pass in C
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n").translate(_CONTROL)
