// Tokenization oracle over llama.cpp's public API (llama.h), used to produce the
// reference vectors in crates/tokenizer/tests/data/. Reads commands on stdin:
//   T <add_special 0|1> <parse_special 0|1> <n_bytes>\n<bytes>   -> "ids..." line
//   D <special 0|1> <n> <id>...\n                                -> hex of llama_detokenize(remove_special=0)
//   E\n                                                          -> EOG ids line
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <iostream>

static void quiet(enum ggml_log_level, const char *, void *) {}

int main(int argc, char ** argv) {
    if (argc < 2) { fprintf(stderr, "usage: oracle MODEL\n"); return 2; }
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    auto mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::string cmd;
    while (std::cin >> cmd) {
        if (cmd == "T") {
            int add, parse; size_t n;
            std::cin >> add >> parse >> n;
            std::cin.get();
            std::string text(n, '\0');
            std::cin.read(&text[0], n);
            std::vector<llama_token> ids(n + 16);
            int k = llama_tokenize(vocab, text.data(), (int) n, ids.data(), (int) ids.size(), add, parse);
            if (k < 0) { ids.resize(-k); k = llama_tokenize(vocab, text.data(), (int) n, ids.data(), (int) ids.size(), add, parse); }
            for (int i = 0; i < k; i++) printf(i ? " %d" : "%d", ids[i]);
            printf("\n");
        } else if (cmd == "D") {
            int special, n; std::cin >> special >> n;
            std::vector<llama_token> ids(n);
            for (int i = 0; i < n; i++) std::cin >> ids[i];
            std::vector<char> buf(64 + 256 * (size_t) n);
            int k = llama_detokenize(vocab, ids.data(), n, buf.data(), (int) buf.size(), false, special);
            if (k < 0) { buf.resize(-k); k = llama_detokenize(vocab, ids.data(), n, buf.data(), (int) buf.size(), false, special); }
            for (int i = 0; i < k; i++) printf("%02x", (unsigned char) buf[i]);
            printf("\n");
        } else if (cmd == "E") {
            int nv = llama_vocab_n_tokens(vocab); bool first = true;
            for (int i = 0; i < nv; i++) if (llama_vocab_is_eog(vocab, i)) { printf(first ? "%d" : " %d", i); first = false; }
            printf("\n");
        }
        fflush(stdout);
    }
    llama_model_free(model);
    return 0;
}
