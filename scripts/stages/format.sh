# Every tracked C/C++ source and header (*.h *.cpp *.cc; not tests' data) is clang-format clean
# under the root .clang-format. clang-format 14 (Debian 12's, installed by scripts/setup.sh):
# other versions format some constructs differently, so the check pins it.
# Fix a file with `clang-format -i FILE`; list the offenders with this stage.
set -euo pipefail
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
command -v "$CLANG_FORMAT" >/dev/null ||
  { echo "format: $CLANG_FORMAT not found (scripts/setup.sh installs Debian's clang-format)"; exit 1; }
version=$("$CLANG_FORMAT" --version)
[[ $version =~ version\ 14\. ]] ||
  { echo "format: needs clang-format 14 (Debian 12's), found: $version"; exit 1; }
git rev-parse --is-inside-work-tree >/dev/null 2>&1 ||
  { echo "format: not a git checkout: the check covers the tracked files"; exit 1; }
mapfile -t files < <(git ls-files -- '*.h' '*.cpp' '*.cc' | grep -v -e '^tests/.*/data/' -e '^third_party/' || true)
((${#files[@]})) || { echo "format: no tracked C/C++ files found"; exit 1; }
# One run over every file; each violation is reported as FILE:LINE:COL: error: ...
out=$("$CLANG_FORMAT" --style=file --dry-run --Werror "${files[@]}" 2>&1) && rc=0 || rc=$?
mapfile -t bad < <(grep -o '^[^:]*:[0-9]*:[0-9]*: error' <<<"$out" | cut -d: -f1 | sort -u)
if ((rc != 0 || ${#bad[@]})); then
  ((${#bad[@]})) || { echo "format: clang-format failed (exit $rc):"; echo "$out" | tail -n 20; exit 1; }
  echo "format: ${#bad[@]} of ${#files[@]} files are not clang-format clean (clang-format -i FILE fixes one):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "format: ${#files[@]} files clang-format clean"
