"""Exit 0 when every requirement in the given files is installed at a version it allows, else 1
with the first one that is not (tools/install.sh then runs pip, which installs it).

    python tools/install/satisfied.py requirements/stack.txt [more files...]

Used by tools/install.sh to skip a pip run that would change nothing: pip itself takes 1-2 s
to start and resolve even then, for each file set. Only plain ``name[extras] <specifier>
; marker`` lines are judged; anything else (an option, a URL, a file reference) is left to
pip, and so is a missing ``packaging`` module.
"""
import importlib.metadata as metadata
import sys


def unsatisfied(lines):
    """The first requirement line that is not installed at an allowed version, or None."""
    from packaging.requirements import InvalidRequirement, Requirement
    for line in lines:
        text = line.split('#', 1)[0].strip()
        if not text:
            continue
        if text.startswith('-'):
            return text  # an option (-r, -e, --index-url): pip's to read
        try:
            req = Requirement(text)
        except InvalidRequirement:
            return text
        if req.url:
            return text
        if req.marker is not None and not req.marker.evaluate():
            continue  # not for this Python or platform
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            return f'{text} (not installed)'
        if not req.specifier.contains(version, prereleases=True):
            return f'{text} ({version} installed)'
    return None


def main(paths) -> int:
    try:
        import packaging.requirements  # noqa: F401
    except ImportError:
        print('packaging is not installed: pip decides')
        return 1
    lines = [ln for path in paths for ln in open(path)]
    first = unsatisfied(lines)
    if first is not None:
        print(f'not satisfied: {first}')
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
