"""utils/units: bytes as whole MiB for logs and tables, with binary units for findings, and the
byte count of a unit read from a message or an option."""
import pytest

from mmddp_ext.utils.units import BYTES_PER_UNIT, GIB, MIB, format_bytes, format_mib


@pytest.mark.parametrize('nbytes, text', [(3 * GIB, '3072 MiB'), (MIB // 2 - 1, '0 MiB'),
                                          (None, '-'), (1.5 * MIB, '2 MiB')])
def test_format_mib(nbytes, text):
    assert format_mib(nbytes) == text


def test_format_mib_unit_and_missing_text():
    assert format_mib(2 * MIB, unit='') == '2'
    assert format_mib(None, missing='unknown') == 'unknown'


@pytest.mark.parametrize('n, text', [(0, '0 B'), (512, '512 B'), (1023, '1023 B'),
                                     (1024, '1.00 KiB'), (int(59.25 * MIB), '59.25 MiB'),
                                     (int(1.89 * GIB), '1.89 GiB'), (1024**3 - 1, '1.00 GiB'),
                                     (2**70, '1024.00 EiB'), (None, 'unknown')])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize('bad', [-1, 1.5, True, '12'])
def test_format_bytes_names_a_bad_count(bad):
    with pytest.raises(ValueError, match=repr(bad).replace('.', r'\.')):
        format_bytes(bad)


@pytest.mark.parametrize('unit, nbytes', [('kib', 1024), ('kb', 1000), ('m', MIB), ('gb', 10**9),
                                          ('gib', GIB), ('t', 2**40), ('b', 1)])
def test_units_binary_and_decimal(unit, nbytes):
    assert BYTES_PER_UNIT[unit] == nbytes
