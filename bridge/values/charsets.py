"""MySQL charset -> Python codec (`CHARSETS`), and the codec lookup every text converter uses.

>>> charset_codec("gbk")[0](b"\\xd6\\xdc")[0]
'周'
"""
from __future__ import annotations

import codecs
from functools import cache

DEFAULT_CHARSET = "utf8mb4"  # text whose charset the Blob side does not name


def _mysql_latin1() -> codecs.CodecInfo:
    # MySQL's latin1 is cp1252 with the five bytes cp1252 leaves undefined mapped to C1 controls,
    # so every byte decodes and re-encodes to itself.
    table = "".join(bytes([b]).decode("cp1252", errors="ignore") or chr(b) for b in range(256))
    enc = codecs.charmap_build(table)
    return codecs.CodecInfo(name="mysql-latin1",
                            encode=lambda s, errors="strict": codecs.charmap_encode(s, errors, enc),
                            decode=lambda b, errors="strict": codecs.charmap_decode(b, errors, table))


MYSQL_LATIN1 = _mysql_latin1()

# MySQL charset -> Python codec name; None for `binary` (bytes, never text). MySQL charsets with no
# exact Python equivalent (armscii8, dec8, geostd8, hp8, keybcs2, swe7, eucjpms) are left out on
# purpose: decoding them with a near relative would silently change characters.
CHARSETS: dict[str, str | None] = {
    "": "utf-8",
    "utf8": "utf-8", "utf8mb3": "utf-8", "utf8mb4": "utf-8",
    "ascii": "ascii",
    "latin1": "mysql-latin1",
    "latin2": "iso8859_2", "latin5": "iso8859_9", "latin7": "iso8859_13",
    "cp1250": "cp1250", "cp1251": "cp1251", "cp1256": "cp1256", "cp1257": "cp1257",
    "cp850": "cp850", "cp852": "cp852", "cp866": "cp866", "cp932": "cp932",
    "greek": "iso8859_7", "hebrew": "iso8859_8",
    "koi8r": "koi8_r", "koi8u": "koi8_u",
    "macce": "mac_latin2", "macroman": "mac_roman",
    "gbk": "gbk", "gb2312": "gb2312", "gb18030": "gb18030",
    "big5": "big5", "euckr": "euc_kr", "sjis": "shift_jis", "ujis": "euc_jp", "tis620": "tis_620",
    "ucs2": "utf-16-be", "utf16": "utf-16-be", "utf16le": "utf-16-le", "utf32": "utf-32-be",
    "binary": None,
}
_IDENTITY_CODECS = frozenset({"utf-8", "ascii", "mysql-latin1"})  # decode then encode is the identity


@cache
def charset_codec(charset: str):
    """(decode, encode, needs_check) for a MySQL charset name, or None when it has no text codec."""
    name = CHARSETS.get(charset.lower(), "?")
    if name is None or name == "?":
        return None
    info = MYSQL_LATIN1 if name == "mysql-latin1" else codecs.lookup(name)
    return info.decode, info.encode, name not in _IDENTITY_CODECS
