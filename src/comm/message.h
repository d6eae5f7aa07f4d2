// What logical ranks send each other: a fixed header and a float payload.
//
// The header says exactly what the payload claims to be; receivers never trust it but check
// it against their own manifest (engine/manifest.h) before using a single value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/float_buffer.h"
#include "core/range.h"

namespace cpd {

enum class MessageKind : std::int32_t {
  q_shard = 1,            // query rows of one token range: [B][heads][rows][D]
  kv_shard = 2,           // K then V rows of one token range: 2 × [B][kv heads][rows][D]
  partial_state = 3,      // (out, lse) of a query range against one KV block:
                          // [B][heads][rows][D] then [B][heads][rows]
  backward_rows = 4,      // what the backward needs of a query range: q, dO ([B][heads][rows][D]
                          // each), then lse, Δ ([B][heads][rows] each)
  dq_partial = 5,         // partial dq of a query range against one KV block: [B][heads][rows][D]
  logit_partial = 6,      // logits of a token range folded over the heads [head_begin, head_end)
                          // in ascending order, candidate then reference: [2][B][rows][vocab]
  reference_grads = 7,    // the CP=1 reference backward of one KV head's GQA group for a token
                          // range: dq [B][group][rows][D], then dk, dv [B][rows][D] each
  reference_forward = 8,  // the CP=1 reference forward of one KV head's GQA group for a token
                          // range, to the rank computing that group's reference backward:
                          // out [B][group][rows][D], then lse [B][group][rows]
  layer_partial = 9,      // the layer's o_proj output of a token range folded over the head
                          // groups of heads [head_begin, head_end), candidate then reference:
                          // [2][B][rows][hidden]
  layer_rows = 10,        // the layer's output of a token range from its owner to another TP
                          // rank, candidate then reference: [2][B][rows][hidden]
  vocab_logits = 11,      // the logits of a token range over the vocabulary range
                          // [head_begin, head_end) the sender holds, to the token owner,
                          // candidate then reference: [2][B][rows][range]
  token_partial = 12,     // a weight gradient's running token sum (engine/token_chain.h): output
                          // rows [token_begin, token_end) of it, folded through chain stage
                          // block_index − 1, candidate then reference: [2][rows][inputs]
};
const char* to_string(MessageKind);

/// Trivially copyable, so a transport can move it as bytes.
struct MessageHeader {
  MessageKind kind = MessageKind::q_shard;
  std::int32_t src = -1;          // logical rank
  std::int32_t dst = -1;          // logical rank
  std::int32_t block_index = -1;  // global KV block index (partial states), else -1
  std::int64_t token_begin = 0;   // token range of the payload's rows
  std::int64_t token_end = 0;
  std::int64_t block_begin = 0;  // KV block range (partial states)
  std::int64_t block_end = 0;
  std::int32_t head_begin = 0;  // head range of the payload
  std::int32_t head_end = 0;
  std::int32_t batch = 0;
  std::int32_t width = 0;   // head_dim
  std::int64_t floats = 0;  // payload length

  Range tokens() const { return Range{token_begin, token_end}; }
  Range block() const { return Range{block_begin, block_end}; }
  Range heads() const { return Range{head_begin, head_end}; }
  friend bool operator==(const MessageHeader&, const MessageHeader&) = default;
};

struct Message {
  MessageHeader header;
  FloatBuffer payload;
};

/// "partial_state block 3 [8,12) from logical rank 1 to 0" — for error messages.
std::string describe(const MessageHeader& h);

}  // namespace cpd
