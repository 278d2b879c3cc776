"""Tutorial 1: log a GPT-2 forward pass and look inside it.

Run it with `python tutorials/01_getting_started.py`; it takes a few seconds on a CPU and
downloads nothing. You will:

1. build a small GPT-2 with Hugging Face `transformers` and log one forward pass;
2. find layers by their label and by the module they ran in;
3. pull out activations and compare the blocks of the transformer with each other;
4. log only the layers you need;
5. export the whole history to a pandas DataFrame.

The test suite runs this file, so every claim below is checked on every commit.
"""
import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

import torchlog

hf_logging.set_verbosity_error()  # keep transformers' config chatter out of the output
torch.manual_seed(0)

# ---------------------------------------------------------------------------------------
# 1. A small GPT-2, logged
# ---------------------------------------------------------------------------------------
# We build the model from a config, so its weights are random and nothing is downloaded.
# The architecture is the real GPT2LMHeadModel: 4 blocks of attention + MLP, hidden size 64.
NUM_BLOCKS = 4
config = GPT2Config(n_layer=NUM_BLOCKS, n_embd=64, n_head=4, vocab_size=500, n_positions=64,
                    bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config).eval()
token_ids = torch.randint(0, config.vocab_size, (1, 16))  # a batch of one 16-token sequence

# One call runs the model and records every tensor operation: its output, the ops that
# fed it, the module it ran in. Keyword arguments of forward go in `input_kwargs`; we turn
# off the key/value cache, which only matters when generating text token by token.
history = torchlog.log_forward_pass(model, token_ids, input_kwargs={"use_cache": False})
print(repr(history))

# `print(history)` shows everything; here are its summary lines only.
print("\n".join(history.summary().splitlines()[:6]))

# The model itself is untouched, and the logged output is exactly what forward returns.
logits = model(token_ids, use_cache=False).logits
assert torch.equal(history[-1].tensor_contents, logits)
print(f"\nThe last entry, {history[-1].label!r}, holds the logits {tuple(logits.shape)}.")

# ---------------------------------------------------------------------------------------
# 2. Finding layers: by label, by position, by module
# ---------------------------------------------------------------------------------------
# Every op gets a label `{type}_{number of this type}_{layer number}`: 'addmm_1_20' is
# the first `addmm` (a matrix multiply plus bias) and layer 20, counting the input as 0.
# In a model without loops, layer 20 is also entry 20 of the history; in a recurrent one
# a layer runs several times and its passes are 'label:1', 'label:2', ...
# `layer_labels` lists the entries in execution order.
print("\nThe first block's attention starts like this:")
first_attention = history.modules["transformer.h.0.attn"].call_layers[0]
print("   ", ", ".join(first_attention[:8]), "...")

# A history is indexed like a dict (by label) and like a list (by position). The short
# form 'addmm_1' (without the position) works too.
qkv = history[first_attention[1]]
assert history["addmm_1"] is qkv and history[qkv.op_index] is qkv
print(f"\n{qkv.label}: {qkv.func_name} -> shape {qkv.shape}, "
      f"parents {qkv.parent_labels}, children {qkv.children}")
print(f"  ran inside {qkv.containing_modules} (innermost first)")
print(f"  used parameters {[p.address for p in qkv.params]}")

# Every submodule of the model has a record in `history.modules`, keyed by the address
# you would use with `model.get_submodule`.
block = history.modules["transformer.h.0"]
print(f"\n{block.address} is a {block.type_name} with {block.num_params} parameters and "
      f"submodules {list(block.children)}; it ran {len(block.call_layers[0])} ops.")

# Indexing the history with a module address gives the op that produced the module's
# output: here the residual `add` that ends block 0.
block_out = history["transformer.h.0"]
print(f"history['transformer.h.0'] is {block_out.label} ({block_out.func_name}), "
      f"the output of {block_out.output_of_modules}")

# To find all layers of one kind, filter the history: it iterates over its entries.
attention_ops = [record.label for record in history if record.layer_type == "scaleddotproductattention"]
print(f"\nOne attention kernel per block: {attention_ops}")

# `history.layers` is the *rolled* view: one record per layer with all its passes. A
# transformer runs each layer once, so it has as many layers as entries; a recurrent
# model would show fewer layers, each with several passes.
print(f"{len(history)} entries, {len(history.layers)} layers, "
      f"largest number of passes of one layer: {max(l.num_passes for l in history.layers)}")

# ---------------------------------------------------------------------------------------
# 3. Activations: how much does each block change the residual stream?
# ---------------------------------------------------------------------------------------
# `tensor_contents` is the saved output of an op. Take the output of every block
# (embeddings first) and compare consecutive ones token by token: a cosine similarity
# near 1 means a block barely changed the direction of the residual stream.
stream = [history["transformer.drop"].tensor_contents]  # the embeddings after dropout
stream += [history[f"transformer.h.{i}"].tensor_contents for i in range(NUM_BLOCKS)]
assert all(t.shape == (1, 16, config.n_embd) for t in stream)

print("\nBlock  mean cos(input, output)  output norm")
for i in range(NUM_BLOCKS):
    before, after = stream[i], stream[i + 1]
    cosine = torch.nn.functional.cosine_similarity(before, after, dim=-1).mean().item()
    print(f"  h.{i}  {cosine:22.3f}  {after.norm(dim=-1).mean().item():11.3f}")

# The saved tensors are copies taken when each op ran, so they are what the next op saw,
# even if the model later modified a tensor in place. You can check one against a
# recomputation: the model's final layer norm applied to its saved input gives its output.
ln_f = history["transformer.ln_f"]
recomputed = model.transformer.ln_f(history[ln_f.parent_labels[0]].tensor_contents)
assert torch.allclose(ln_f.tensor_contents, recomputed)
print(f"\n{ln_f.label} (transformer.ln_f) matches a recomputation from its saved input.")

# ---------------------------------------------------------------------------------------
# 4. Saving only what you need
# ---------------------------------------------------------------------------------------
# Saving every activation of a big model costs memory. `layers_to_save` takes labels,
# module addresses, positions or substrings; exactly those passes are kept
# (so `history.output_layers` is empty unless 'output' is among them).
block_addresses = [f"transformer.h.{i}" for i in range(NUM_BLOCKS)]
blocks_only = torchlog.log_forward_pass(model, token_ids, input_kwargs={"use_cache": False},
                                        layers_to_save=block_addresses)
print(f"\nSaving all layers kept {history.num_saved_bytes / 1024:.1f} KB in {history.num_saved} "
      f"tensors; saving the block outputs kept {blocks_only.num_saved_bytes / 1024:.1f} KB "
      f"in {blocks_only.num_saved}.")
assert blocks_only.layer_labels == [history[a].label for a in block_addresses]
assert blocks_only.output_layers == [] and history.output_layers
for address in block_addresses:  # the same values as in the full log
    assert torch.equal(blocks_only[address].tensor_contents, history[address].tensor_contents)

# ---------------------------------------------------------------------------------------
# 5. The history as a table
# ---------------------------------------------------------------------------------------
# `to_pandas()` gives one row per entry, ready for the usual pandas tools.
table = history.to_pandas()
print(f"\nto_pandas(): {len(table)} rows, columns {list(table.columns)}")

print("\nMost frequent op types:")
print(table["layer_type"].value_counts().head(6).to_string())

print("\nActivation memory per block (KB):")
per_block = table["module"].str.extract(r"^(transformer\.h\.\d+)")[0].rename("block")
print((table.groupby(per_block)["num_bytes"].sum() / 1024).round(1).to_string())

print("\nThe five largest outputs:")
print(table.nlargest(5, "num_bytes")[["label", "module", "shape", "num_bytes"]].to_string(index=False))
