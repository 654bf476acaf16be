# The fuzz targets: tests/fuzz/fuzz_<name>.c each, with a seed corpus in
# tests/fuzz/corpus/<name>/ and findings in tests/fuzz/regressions/<name>/.
# Included by CMakeLists.txt (TPR_FUZZ: libFuzzer binaries, clang) and by
# tests/CMakeLists.txt (replay of corpus + regressions under ctest).
set(TPR_FUZZ_TARGETS safetensors config program manifest npy tokenizer oai)
# The HTTP/1.1 byte-stream parser of tpr serve (serve/http.c) gets its target
# here: add "http" to the list above with tests/fuzz/fuzz_http.c, a seed
# corpus in corpus/http/ and regressions/http/; scripts/fuzz.sh reads this list.
set(TPR_FUZZ_DIR ${CMAKE_SOURCE_DIR}/tests/fuzz)
