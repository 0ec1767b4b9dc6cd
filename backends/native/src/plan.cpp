#include "plan.h"

#include <algorithm>
#include <limits>

#include "checked.h"

namespace onnxlens {

namespace {

// No single tensor, arena or scratch area above 2^40 bytes (1 TiB): a plan asking for more is
// malformed, and refusing it keeps every later offset sum far from overflow.
constexpr int64_t kMaxBytes = int64_t{1} << 40;

struct Lifetime {
  int64_t begin = std::numeric_limits<int64_t>::max();
  int64_t end = -1;
};

void resolve_one(const TensorSpec& s, const PlanSpec& plan, char* arena, char* scratch,
                 Tensor& t) {
  t.name = s.name;
  t.dtype = static_cast<DType>(s.dtype);
  t.shape = s.shape;
  const int64_t size = dtype_size(s.dtype);
  t.numel = checked_product(s.shape);
  t.nbytes = checked_mul(t.numel, size);
  require(t.nbytes <= kMaxBytes, "tensor ", s.name, ": ", t.nbytes, " bytes is too large");
  static const std::vector<int> storages = {
#define STORAGE(name, code) code,
#include "ops.def"
  };
  require(std::find(storages.begin(), storages.end(), s.storage) != storages.end(), "tensor ",
          s.name, ": unknown storage ", s.storage);
  t.storage = static_cast<Storage>(s.storage);
  t.offset = s.offset;
  if (t.storage == Storage::constant) {
    require(s.offset >= 0 && s.offset < static_cast<int64_t>(plan.constants.size()),
            "tensor ", s.name, ": no constant #", s.offset);
    const ConstBuffer& c = plan.constants[static_cast<size_t>(s.offset)];
    require(c.nbytes == t.nbytes, "tensor ", s.name, ": its data holds ", c.nbytes,
            " bytes, its shape ", show(s.shape), " needs ", t.nbytes);
    require(reinterpret_cast<uintptr_t>(c.data) % static_cast<uintptr_t>(size) == 0, "tensor ",
            s.name, ": its data is not aligned to its ", size, "-byte elements");
    t.data = const_cast<void*>(c.data);  // kernels never write constants (KernelContext)
    return;
  }
  const int64_t area = t.storage == Storage::arena ? plan.arena_bytes : plan.scratch_bytes;
  // (require's arguments are all evaluated: no unchecked offset + nbytes in the message)
  require(s.offset >= 0 && checked_add(s.offset, t.nbytes) <= area, "tensor ", s.name, ": ",
          t.nbytes, " bytes at offset ", s.offset, " leave its area of ", area);
  // The areas start on a cache line (huge_pages.h), and plan.py puts tensors on lines too; an
  // offset of whole elements is what keeps every element aligned (a misaligned float is
  // undefined behavior, found by tests/sanitize.sh).
  require(s.offset % size == 0, "tensor ", s.name, ": offset ", s.offset,
          " is not a multiple of its ", size, "-byte elements");
  char* base = t.storage == Storage::arena ? arena : scratch;
  t.data = base != nullptr ? base + s.offset : nullptr;
}

void check_disjoint(std::vector<std::pair<const Tensor*, Lifetime>>& live, const char* what) {
  std::sort(live.begin(), live.end(),
            [](const auto& a, const auto& b) { return a.first->offset < b.first->offset; });
  for (size_t i = 0; i < live.size(); ++i) {
    const Tensor& a = *live[i].first;
    for (size_t j = i + 1; j < live.size(); ++j) {
      const Tensor& b = *live[j].first;
      if (b.offset >= a.offset + a.nbytes) break;
      const Lifetime& la = live[i].second;
      const Lifetime& lb = live[j].second;
      const bool at_once = la.begin <= lb.end && lb.begin <= la.end;
      require(!at_once || a.nbytes == 0 || b.nbytes == 0, what, " tensors ", a.name, " and ",
              b.name, " overlap in memory while both are live");
    }
  }
}

}  // namespace

int64_t dtype_size(int code) {
  switch (static_cast<DType>(code)) {
    case DType::u8: case DType::i8: case DType::boolean: return 1;
    case DType::u16: case DType::i16: case DType::f16: return 2;
    case DType::f32: case DType::i32: case DType::u32: return 4;
    case DType::i64: case DType::f64: case DType::u64: return 8;
  }
  throw PlanError(cat("unsupported element type ", code));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::u8: return "uint8";
    case DType::i8: return "int8";
    case DType::u16: return "uint16";
    case DType::i16: return "int16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::boolean: return "bool";
    case DType::f16: return "float16";
    case DType::f64: return "float64";
    case DType::u32: return "uint32";
    case DType::u64: return "uint64";
  }
  return "unknown";
}

std::vector<Tensor> resolve_tensors(const PlanSpec& plan, char* arena, char* scratch) {
  require(plan.arena_bytes >= 0 && plan.arena_bytes <= kMaxBytes, "arena of ",
          plan.arena_bytes, " bytes");
  require(plan.scratch_bytes >= 0 && plan.scratch_bytes <= kMaxBytes, "scratch area of ",
          plan.scratch_bytes, " bytes");
  std::vector<Tensor> tensors(plan.tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    resolve_one(plan.tensors[i], plan, arena, scratch, tensors[i]);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& s = plan.tensors[i];
    if (s.alias == -1) continue;
    require(s.alias >= 0 && static_cast<size_t>(s.alias) < tensors.size(), "tensor ", s.name,
            ": no tensor #", s.alias, " to share bytes with");
    const TensorSpec& root = plan.tensors[static_cast<size_t>(s.alias)];
    require(s.storage == static_cast<int>(Storage::arena) && root.storage == s.storage &&
                root.alias == -1 && root.offset == s.offset &&
                tensors[static_cast<size_t>(s.alias)].nbytes == tensors[i].nbytes,
            "tensor ", s.name, " cannot share the bytes of ", root.name);
  }
  return tensors;
}

void check_arena_lifetimes(const PlanSpec& plan, const std::vector<Tensor>& tensors) {
  const auto count = static_cast<int64_t>(tensors.size());
  auto valid = [&](int id) { return id >= 0 && id < count; };
  // An alias is its bytes' tensor: written when that is, live while either is read.
  auto bytes_of = [&](int id) {
    return valid(id) && plan.tensors[static_cast<size_t>(id)].alias >= 0
               ? plan.tensors[static_cast<size_t>(id)].alias
               : id;
  };
  std::vector<Lifetime> life(tensors.size());
  std::vector<bool> written(tensors.size(), false);
  for (int id : plan.inputs) {
    require(valid(id) && tensors[id].storage == Storage::arena, "graph input #", id,
            " is not an arena tensor");
    id = bytes_of(id);
    life[id].begin = -1;
    written[id] = true;
  }
  const auto last = static_cast<int64_t>(plan.steps.size());
  for (int64_t s = 0; s < last; ++s) {
    std::vector<std::pair<const Tensor*, Lifetime>> scratch;
    for (const KernelSpec& k : plan.steps[s].kernels) {
      auto touch = [&](int id, bool write) {
        if (id == -1 && !write) return;
        require(valid(id), "step ", s, " (", k.op, "): no tensor #", id);
        require(!write || plan.tensors[static_cast<size_t>(id)].alias == -1, "step ", s, " (",
                k.op, ") writes ", tensors[id].name, ", which shares another tensor's bytes");
        id = bytes_of(id);
        Lifetime& l = life[id];
        l.begin = std::min(l.begin, s);
        l.end = std::max(l.end, s);
        if (write) written[id] = true;
        require(written[id] || tensors[id].storage == Storage::constant, "step ", s, " (", k.op,
                ") reads ", tensors[id].name, " before anything writes it");
        if (tensors[id].storage == Storage::scratch) scratch.push_back({&tensors[id], {s, s}});
      };
      for (int id : k.outputs) touch(id, true);
      for (int id : k.inputs) touch(id, false);
      for (const OperandSpec& o : k.operands) touch(o.tensor, false);
    }
    std::sort(scratch.begin(), scratch.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    scratch.erase(std::unique(scratch.begin(), scratch.end(),
                              [](const auto& a, const auto& b) { return a.first == b.first; }),
                  scratch.end());
    check_disjoint(scratch, "scratch");
  }
  for (int id : plan.outputs) {
    require(valid(id) && tensors[id].storage == Storage::arena && written[bytes_of(id)],
            "graph output #", id, " is not a written arena tensor");
    life[bytes_of(id)].end = last;
  }
  std::vector<std::pair<const Tensor*, Lifetime>> arena;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].storage == Storage::arena && life[i].end >= 0) {
      arena.push_back({&tensors[i], life[i]});
    }
  }
  check_disjoint(arena, "arena");
}

}  // namespace onnxlens
