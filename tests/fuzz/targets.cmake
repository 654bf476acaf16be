# The fuzz targets: tests/fuzz/fuzz_<name>.c each, with a seed corpus in
# tests/fuzz/corpus/<name>/ and findings in tests/fuzz/regressions/<name>/.
# Included by CMakeLists.txt (TPR_FUZZ: libFuzzer binaries, clang) and by
# tests/CMakeLists.txt (replay of corpus + regressions under ctest).
set(TPR_FUZZ_TARGETS safetensors config program manifest npy tokenizer oai http jinja)
# jinja: chat templates (jinja/), parsed and rendered with tight limits.
# http: the HTTP/1.1 request reader of tpr serve (serve/http_reader.c).
# scripts/fuzz.sh reads this list.
set(TPR_FUZZ_DIR ${CMAKE_SOURCE_DIR}/tests/fuzz)
