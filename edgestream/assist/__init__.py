"""The voice assistant: streaming speech recognition, then an answer decoded by the LLM engine.

The names below are the library's front door (docs/python-api.md), imported on first use:

    from edgestream.assist import Assistant

    assistant = Assistant.load()  # the bundled recognizer and SmolLM2 with its streams
    heard = assistant.transcribe("question.wav")
    print(heard.text, assistant.answer(heard.text).text)  # ss-pld: streams + prompt lookup
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgestream.lazy_exports import lazy_exports

_EXPORTS = {
    "Assistant": "edgestream.assist.pipeline",
    "AssistantConfig": "edgestream.assist.pipeline",
    "Answer": "edgestream.assist.pipeline",
}

if TYPE_CHECKING:
    from edgestream.assist.pipeline import Answer, Assistant, AssistantConfig

__all__ = ["Answer", "Assistant", "AssistantConfig"]  # the keys of _EXPORTS


__getattr__ = lazy_exports(__name__, _EXPORTS)
