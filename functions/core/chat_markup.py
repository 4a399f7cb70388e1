"""Text from a report, made plain for a chat channel: what a sender wrote can be read there, but it
cannot address people, hide a link, or pass as a control sequence of the chat service.

Every value a notice takes from an audit record is text its sender chose: a VM names itself and
describes its event, and a report nobody vouches for (unverified, not-self, malformed) says
whatever anyone who can publish to the bus wants it to. JSON escaping (functions/core/notify.py)
keeps such text from changing the body; this keeps it from acting in the channel. What is
neutralised, and why:

- Slack reads `<...>` as a control sequence: `<!channel>`, `<!here>`, `<!everyone>` notify a whole
  channel, `<@U123>` a person, `<!subteam^S1>` a group, `<https://a|text>` is a link showing other
  text. Slack's documented escaping is `&` -> `&amp;`, `<` -> `&lt;`, `>` -> `&gt;` (and only
  these are decoded back), which also makes Teams' `<at>` tags and Discord's `<@123>` mentions
  plain text. (Discord does not decode entities: it shows `&lt;` as typed, still inert.)
- `@channel`, `@here`, `@everyone` and `@name` are mentions where the service parses names
  (Discord always; Slack with `link_names`, which a template may set): a zero-width space after the
  `@` leaves the text as it reads and matches no mention.
- `[text](url)` is a link showing other text in Teams and Discord markdown: a zero-width space
  between `]` and `(` leaves the words and the address visible, not the disguise.
- `scheme://` is linked by every client by itself: a zero-width space after the `:` leaves the
  address readable and not clickable. (A bare domain name, `evil.example`, may still be linked by
  a client that guesses: docs/operations.md says so.)

Left alone: emphasis, code spans and headings (`*`, `_`, `~`, backquotes, `#`). They change how text
looks, not whom it reaches or where a click goes; escaping them would garble VM names and reasons
in every service that does not read them.

Pure and standard library only (functions/core runs on Python 3.9).
"""

from __future__ import annotations

import re

# Invisible, and matched by no mention, link or markdown parser.
ZERO_WIDTH_SPACE = "\u200b"

# Slack's three (https://api.slack.com/reference/surfaces/formatting#escaping); `&` first, so that
# the entities the other two make are not escaped again.
_SLACK_ESCAPES = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"))
# An `@` that starts a name (a mention), and a URL's `://`.
_MENTION = re.compile(r"@(?=\w)")
_URL_SCHEME = re.compile(r"(?<=[A-Za-z0-9+.-]):(?=//)")


def neutralised(text: str) -> str:
    """`text` with chat markup made inert (see the module's docstring): it reads the same to people."""
    for character, entity in _SLACK_ESCAPES:
        text = text.replace(character, entity)
    text = _MENTION.sub("@" + ZERO_WIDTH_SPACE, text)
    # Markdown (CommonMark, Teams, Discord) takes `[text](url)` only with nothing between `]` and `(`.
    text = text.replace("](", "]" + ZERO_WIDTH_SPACE + "(")
    return _URL_SCHEME.sub(":" + ZERO_WIDTH_SPACE, text)
