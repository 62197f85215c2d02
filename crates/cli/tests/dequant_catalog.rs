//! Every tensor of the three catalog models dequantizes (the scalar reference kernels of
//! frink-quant over real files fetched through the store) to finite values of the right
//! count. Bit-exactness per format is proven in crates/quant against ggml's own output;
//! this test proves coverage: no tensor type in a real file is left unsupported.

use frink_gguf::GgufFile;
use frink_store::Store;

#[test]
fn every_tensor_of_the_catalog_models_dequantizes() {
    let store = Store::from_env().expect("model store");
    for name in ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"] {
        let path = store
            .pull(name)
            .unwrap_or_else(|e| panic!("pull {name}: {e}"));
        let f = GgufFile::open(&path).unwrap();
        let mut n_values = 0u64;
        for t in f.tensors() {
            let values = frink_quant::dequantize_tensor(&t)
                .unwrap_or_else(|e| panic!("{name} {}: {e}", t.info.name));
            assert_eq!(
                values.len() as u64,
                t.info.n_elements(),
                "{name} {}",
                t.info.name
            );
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                panic!("{name} {}: non-finite value at {i}", t.info.name);
            }
            n_values += values.len() as u64;
        }
        eprintln!(
            "{name}: {} tensors, {n_values} values",
            f.tensor_infos().len()
        );
    }
}
