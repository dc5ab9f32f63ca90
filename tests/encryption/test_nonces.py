"""Each sealed value's nonce: 12 bytes from the OS, never used twice, a forked child included.

Nonces are drawn from the OS in blocks (one ``os.urandom`` call releases the GIL, which cost
a worker a claim-loop round per sealed job); these tests hold the block to what one nonce per
``os.urandom`` call promised. No database: the ciphers and the suite's key only.
"""

from __future__ import annotations

import binascii
import os

import pytest

from django_jobguard import encryption
from django_jobguard.encryption import TOKEN_PREFIX, decrypt_text, encrypt_text

# More than two of the blocks drawn at once: the refill is crossed.
SEALS = 3 * encryption._NONCE_BLOCK + 7


def _nonce_of(token: str) -> bytes:
    body = token[len(TOKEN_PREFIX) :].partition(":")[2]
    return binascii.a2b_base64(body)[:12]


def _nonces(count: int) -> list[bytes]:
    return [_nonce_of(encrypt_text(f"card {n}", field="args")) for n in range(count)]


def test_every_seal_takes_a_nonce_of_its_own_and_opens():
    tokens = [encrypt_text(f"card {n}", field="args") for n in range(SEALS)]
    nonces = [_nonce_of(token) for token in tokens]
    assert all(len(nonce) == 12 for nonce in nonces)
    assert len(set(nonces)) == SEALS
    assert [decrypt_text(token, field="args") for token in tokens] == [f"card {n}" for n in range(SEALS)]


def test_nonces_come_from_the_os_a_block_at_a_time(monkeypatch):
    calls = []
    real = os.urandom

    def counted(size: int) -> bytes:
        calls.append(size)
        return real(size)

    monkeypatch.setattr(os, "urandom", counted)
    encryption._nonces.clear()
    _nonces(SEALS)
    assert calls == [12 * encryption._NONCE_BLOCK] * 4  # 3 blocks and 7 more: 4 draws, not 775


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_draws_the_nonces_its_parent_holds():
    encryption._nonces.clear()
    _nonces(1)  # the parent now holds the rest of a block
    assert encryption._nonces
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: seal as many values as the parent still holds, send their nonces
        try:
            os.write(write, b"".join(_nonces(encryption._NONCE_BLOCK)))
        finally:
            os._exit(0)
    os.close(write)
    received = b""
    while chunk := os.read(read, 65536):
        received += chunk
    os.close(read)
    assert os.waitpid(pid, 0)[1] == 0
    child = {received[i : i + 12] for i in range(0, len(received), 12)}
    assert len(child) == encryption._NONCE_BLOCK
    parent = set(_nonces(encryption._NONCE_BLOCK))
    assert not child & parent
