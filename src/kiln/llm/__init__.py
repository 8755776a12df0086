"""kiln.llm: a Llama-family decoder and a fast generation engine (static KV cache, compiled
prefill per padded length, decode step compiled and replayed as a CUDA graph).

    from kiln.llm import Engine, Sampling, build_decoder, resolve_model
    model = build_decoder(resolve_model("llama-3.2-1b"), device="cuda", dtype=torch.bfloat16)
    out = Engine(model, compile=True).generate([[128000, 9906]], max_new_tokens=32)
"""

from kiln.llm.config import ModelSource, config_from_dict, resolve_model
from kiln.llm.decoder_config import DecoderConfig
from kiln.llm.engine import Engine, Generation, bucket_length
from kiln.llm.model import Decoder, KVCache
from kiln.llm.sampling import Sampling
from kiln.llm.weights import build_decoder, load_hf_state_dict, random_decoder

__all__ = [
    "Decoder", "DecoderConfig", "Engine", "Generation", "KVCache", "ModelSource", "Sampling", "bucket_length",
    "build_decoder", "config_from_dict", "load_hf_state_dict", "random_decoder", "resolve_model",
]
