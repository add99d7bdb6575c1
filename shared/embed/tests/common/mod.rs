//! What the ONNX tests share.

/// A tolerance for an int8 graph's outputs against the references (made on the machines of
/// 2026-11-25 to 12-07, where every test passed at `tight`): `tight` on a CPU with VNNI (8-bit
/// dot products summed in 32 bits), `loose` on one without. There ONNX Runtime's u8×s8 kernels
/// add pairs of products in 16 bits (`vpmaddubsw`), which can saturate, so an int8 graph's
/// outputs move further from the reference: on an AVX2-only AMD EPYC (2026-12-07) MiniLM int8's
/// "Ok" came to cosine 0.989 to f32, a cross-encoder logit 0.12 off, a MaxSim 0.003 off. A
/// wrong tokenizer, prefix, pooling or batch moves them by far more than `loose`.
pub fn int8_tolerance(tight: f32, loose: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if !std::arch::is_x86_feature_detected!("avx512vnni")
            && !std::arch::is_x86_feature_detected!("avxvnni")
        {
            return loose;
        }
    }
    let _ = loose;
    tight
}
