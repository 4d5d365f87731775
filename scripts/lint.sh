#!/usr/bin/env bash
# Lint and format checks (what pre-commit runs): ruff on Python, clang-format on csrc/.
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check .
ruff format --check .
find csrc -name '*.cpp' -o -name '*.h' | xargs clang-format --dry-run --Werror
echo "lint: ok"
