"""A real third-party cffi binding: soundfile (libsndfile, cffi ABI mode, wheels on PyPI).

``soundfile.SoundFile`` wraps a native ``SNDFILE*`` with ``close()`` and a ``__del__``
that closes it.  soundfile exits without noise or crash in the runs below; what goes
wrong without exitsafe is silent data loss: when a daemon thread (a progress spinner,
an audio callback thread) keeps the main module's globals alive, the interpreter never
finalizes the open file, libsndfile never writes the final WAV header, and the file
is unreadable (the standard library's ``wave`` rejects it).  ``adopt`` closes
it at exit, in dependency order.  The ordering and leak tests then record the release
order with soundfile objects through the ledger.
"""

from __future__ import annotations

import wave

import pytest

from ..support import assert_clean, run_py

sf = pytest.importorskip(
    "soundfile", reason="soundfile (the third-party cffi binding under test) is not installed"
)
pytest.importorskip("numpy", reason="soundfile needs numpy")

RECORDER = """
import threading, time
import numpy as np
import soundfile as sf
{protect}

def spinner():          # any daemon thread that is still running at exit
    while True:
        time.sleep(0.05)

threading.Thread(target=spinner, daemon=True).start()
take = sf.SoundFile("take.wav", "w", 44100, 1)
{adopt}
take.write(np.zeros(1000))
print("recorded")
"""


def frames(path):
    with wave.open(str(path)) as w:
        return w.getnframes()


def test_unclosed_soundfile_loses_its_header_without_exitsafe(tmp_path):
    proc = run_py(RECORDER.format(protect="", adopt=""), tmp_path)
    assert proc.returncode == 0 and "recorded" in proc.stdout, proc.stderr
    # Exit 0, no noise, but the WAV file was never finalized.
    with pytest.raises(wave.Error):
        frames(tmp_path / "take.wav")


def test_adopted_soundfile_is_closed_at_exit(tmp_path):
    proc = run_py(
        RECORDER.format(protect="from exitsafe import adopt", adopt="adopt(take)"),
        tmp_path,
    )
    assert_clean(proc)
    assert frames(tmp_path / "take.wav") == 1000


def test_soundfile_on_a_python_file_closes_before_the_file(tmp_path):
    """A SoundFile writing through cffi callbacks into a Python file object: the sound
    file must be closed (header written through the callbacks) before the file object."""
    proc = run_py(
        """
import json, numpy as np, soundfile as sf
import exitsafe
from exitsafe import adopt

raw = open("virtual.wav", "wb")
snd = sf.SoundFile(raw, "w", 8000, 1, format="WAV")
adopt(raw, name="file object")
adopt(snd, name="sound file", depends_on=[raw])
snd.write(np.zeros(800))

class Holder:                      # both end up in a reference cycle
    pass
h = Holder(); h.self = h; h.items = (snd, raw)
""",
        tmp_path,
        env={"EXITSAFE_LEDGER": str(tmp_path / "ledger.json")},
    )
    assert_clean(proc)
    import json

    ledger = json.loads((tmp_path / "ledger.json").read_text())
    entries = [
        (e["name"], e["outcome"])
        for reg in ledger["registries"]
        for e in reg["entries"]
        if e["name"] in ("sound file", "file object")
    ]
    assert entries == [
        ("sound file", "released_at_exit"),
        ("file object", "released_at_exit"),
    ]
    assert frames(tmp_path / "virtual.wav") == 800


def test_neutralized_soundfile_makes_no_native_call_after_teardown(tmp_path):
    """Leak policy: the SNDFILE* is deliberately not closed, and the object's own
    ``__del__`` / ``close()`` becomes a no-op (``SoundFile.closed`` is ``_file is None``)."""
    proc = run_py(
        """
import numpy as np, soundfile as sf
import exitsafe
from exitsafe.lowlevel import neutralize_at_exit

take = sf.SoundFile("leak.wav", "w", 8000, 1)
take.write(np.zeros(10))
hook = neutralize_at_exit(take, "_file")

def check():
    assert take.closed            # neutralized: close() will do nothing
    take.close()                  # no native call, no error
    print("checked")

exitsafe.on_teardown(check, after=[hook])
""",
        tmp_path,
    )
    assert_clean(proc)
    assert "checked" in proc.stdout


def test_adopt_neutralize_with_leak_policy_in_process(tmp_path):
    import exitsafe
    from exitsafe import adopt

    registry = exitsafe.Registry("soundfile")
    snd = sf.SoundFile(str(tmp_path / "x.wav"), "w", 8000, 1)
    handle = adopt(snd, registry=registry, exit_policy="leak", neutralize="_file")
    registry.teardown()
    assert handle.state == "leaked" and snd.closed
    snd.close()  # the object's own close: a no-op now
