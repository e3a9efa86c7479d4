// A pickle reader for torch.save'd state_dicts. See
// include/crucible/models/torch_save_reader.h. Opcodes: Python's
// Lib/pickletools.py (protocol 2, which torch.save writes); tensors:
// torch/_utils.py _rebuild_tensor_v2(storage, storage_offset, size, stride,
// requires_grad, backward_hooks[, metadata]) with storages as persistent ids
// ('storage', torch.<Type>Storage, key, location, numel) stored in the zip
// entry data/<key>.

#include "crucible/models/torch_save_reader.h"
#include "crucible/common/error.h"

#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <memory>
#include <variant>
#include <vector>

namespace crucible {
namespace {

struct Obj;
using Ptr = std::shared_ptr<Obj>;
struct Global {
  std::string module, name;
};
struct Storage {
  at::ScalarType dtype;
  std::string key;
};
struct Mark {};
struct Obj {
  // None, bool, int, double, string, tuple/list, dict, global, storage, tensor, mark
  std::variant<std::monostate, bool, int64_t, double, std::string, std::vector<Ptr>, std::vector<std::pair<Ptr, Ptr>>,
               Global, Storage, at::Tensor, Mark>
      v;
};

Ptr make(decltype(Obj::v) v) {
  auto p = std::make_shared<Obj>();
  p->v = std::move(v);
  return p;
}

at::ScalarType storage_dtype(const std::string& name, const std::string& path) {
  static const std::map<std::string, at::ScalarType> types = {
      {"DoubleStorage", at::kDouble}, {"FloatStorage", at::kFloat}, {"HalfStorage", at::kHalf},
      {"BFloat16Storage", at::kBFloat16}, {"LongStorage", at::kLong}, {"IntStorage", at::kInt},
      {"ShortStorage", at::kShort}, {"CharStorage", at::kChar}, {"ByteStorage", at::kByte},
      {"BoolStorage", at::kBool}};
  auto it = types.find(name);
  if (it == types.end()) throw DataError(path + ": unsupported tensor storage type torch." + name);
  return it->second;
}

class Reader {
 public:
  Reader(const std::string& path, const std::string& pickle, caffe2::serialize::PyTorchStreamReader& zip)
      : path_(path), p_(pickle), zip_(zip) {}

  Ptr run() {
    while (true) {
      const uint8_t op = byte();
      switch (op) {
        case 0x80: byte(); break;                                   // PROTO
        case '}': push(make(std::vector<std::pair<Ptr, Ptr>>{})); break;  // EMPTY_DICT
        case ']': push(make(std::vector<Ptr>{})); break;            // EMPTY_LIST
        case ')': push(make(std::vector<Ptr>{})); break;            // EMPTY_TUPLE
        case 'N': push(make(std::monostate{})); break;              // NONE
        case 0x88: push(make(true)); break;                         // NEWTRUE
        case 0x89: push(make(false)); break;                        // NEWFALSE
        case 'K': push(make(static_cast<int64_t>(byte()))); break;  // BININT1
        case 'M': push(make(static_cast<int64_t>(uint_le(2)))); break;  // BININT2
        case 'J': push(make(static_cast<int64_t>(static_cast<int32_t>(uint_le(4))))); break;  // BININT
        case 0x8a: {  // LONG1
          const size_t n = byte();
          int64_t v = 0;
          for (size_t k = 0; k < n && k < 8; ++k) v |= static_cast<int64_t>(static_cast<uint8_t>(p_[pos_ + k])) << (8 * k);
          if (n > 0 && n < 8 && (static_cast<uint8_t>(p_[pos_ + n - 1]) & 0x80)) v -= int64_t{1} << (8 * n);
          pos_ += n;
          push(make(v));
          break;
        }
        case 'G': {  // BINFLOAT, big-endian
          uint64_t bits = 0;
          for (int k = 0; k < 8; ++k) bits = (bits << 8) | byte();
          double d;
          std::memcpy(&d, &bits, 8);
          push(make(d));
          break;
        }
        case 'X': push(make(text(uint_le(4)))); break;  // BINUNICODE
        case 0x8c: push(make(text(byte()))); break;     // SHORT_BINUNICODE
        case 'c': {                                     // GLOBAL
          const std::string module = line(), name = line();
          push(make(Global{module, name}));
          break;
        }
        case 'q': memo(byte()); break;      // BINPUT
        case 'r': memo(uint_le(4)); break;  // LONG_BINPUT
        case 'h': push(get(byte())); break;      // BINGET
        case 'j': push(get(uint_le(4))); break;  // LONG_BINGET
        case '(': push(make(Mark{})); break;     // MARK
        case 't': push(make(pop_mark())); break;  // TUPLE
        case 0x85: case 0x86: case 0x87: {        // TUPLE1..3
          std::vector<Ptr> items(static_cast<size_t>(op - 0x84));
          for (size_t k = items.size(); k-- > 0;) items[k] = pop();
          push(make(items));
          break;
        }
        case 'a': {  // APPEND
          Ptr v = pop();
          list_of(top()).push_back(v);
          break;
        }
        case 'e': {  // APPENDS
          std::vector<Ptr> items = pop_mark();
          auto& l = list_of(top());
          l.insert(l.end(), items.begin(), items.end());
          break;
        }
        case 's': {  // SETITEM
          Ptr v = pop(), k = pop();
          dict_of(top()).emplace_back(k, v);
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<Ptr> items = pop_mark();
          auto& d = dict_of(top());
          for (size_t k = 0; k + 1 < items.size(); k += 2) d.emplace_back(items[k], items[k + 1]);
          break;
        }
        case 'b': pop(); break;  // BUILD: an OrderedDict's _metadata; not needed
        case 'Q': push(persistent(pop())); break;  // BINPERSID
        case 'R': {                                // REDUCE
          Ptr args = pop(), fn = pop();
          push(reduce(fn, args));
          break;
        }
        case '.': return pop();  // STOP
        default: {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", op);
          throw DataError(path_ + ": unsupported pickle opcode " + hex + " at byte " + std::to_string(pos_ - 1) +
                          " (not a plain state_dict)");
        }
      }
    }
  }

 private:
  uint8_t byte() {
    if (pos_ >= p_.size()) throw DataError(path_ + ": truncated pickle (data.pkl)");
    return static_cast<uint8_t>(p_[pos_++]);
  }
  uint64_t uint_le(int n) {
    uint64_t v = 0;
    for (int k = 0; k < n; ++k) v |= static_cast<uint64_t>(byte()) << (8 * k);
    return v;
  }
  std::string text(uint64_t n) {
    if (pos_ + n > p_.size()) throw DataError(path_ + ": truncated pickle (data.pkl)");
    std::string s = p_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::string line() {
    const size_t end = p_.find('\n', pos_);
    if (end == std::string::npos) throw DataError(path_ + ": truncated pickle (data.pkl)");
    std::string s = p_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }
  void push(Ptr p) { stack_.push_back(std::move(p)); }
  Ptr pop() {
    if (stack_.empty()) throw DataError(path_ + ": malformed pickle (stack underflow)");
    Ptr p = stack_.back();
    stack_.pop_back();
    return p;
  }
  Ptr& top() {
    if (stack_.empty()) throw DataError(path_ + ": malformed pickle (stack underflow)");
    return stack_.back();
  }
  std::vector<Ptr> pop_mark() {
    std::vector<Ptr> items;
    while (true) {
      Ptr p = pop();
      if (std::holds_alternative<Mark>(p->v)) break;
      items.push_back(p);
    }
    return {items.rbegin(), items.rend()};
  }
  void memo(uint64_t k) { memo_[k] = top(); }
  Ptr get(uint64_t k) {
    auto it = memo_.find(k);
    if (it == memo_.end()) throw DataError(path_ + ": malformed pickle (memo " + std::to_string(k) + ")");
    return it->second;
  }
  std::vector<Ptr>& list_of(Ptr& p) {
    if (auto* l = std::get_if<std::vector<Ptr>>(&p->v)) return *l;
    throw DataError(path_ + ": malformed pickle (append to a non-list)");
  }
  std::vector<std::pair<Ptr, Ptr>>& dict_of(Ptr& p) {
    if (auto* d = std::get_if<std::vector<std::pair<Ptr, Ptr>>>(&p->v)) return *d;
    throw DataError(path_ + ": malformed pickle (setitem on a non-dict)");
  }
  const std::vector<Ptr>& tuple(const Ptr& p) {
    if (auto* l = std::get_if<std::vector<Ptr>>(&p->v)) return *l;
    throw DataError(path_ + ": malformed pickle (expected a tuple)");
  }
  int64_t integer(const Ptr& p) {
    if (auto* i = std::get_if<int64_t>(&p->v)) return *i;
    throw DataError(path_ + ": malformed pickle (expected an integer)");
  }
  std::vector<int64_t> ints(const Ptr& p) {
    std::vector<int64_t> out;
    for (const auto& x : tuple(p)) out.push_back(integer(x));
    return out;
  }
  Ptr persistent(const Ptr& pid) {
    const auto& t = tuple(pid);
    const auto* kind = t.empty() ? nullptr : std::get_if<std::string>(&t[0]->v);
    const auto* type = t.size() > 1 ? std::get_if<Global>(&t[1]->v) : nullptr;
    const auto* key = t.size() > 2 ? std::get_if<std::string>(&t[2]->v) : nullptr;
    if (!kind || *kind != "storage" || !type || !key) throw DataError(path_ + ": unsupported persistent id in the pickle");
    return make(Storage{storage_dtype(type->name, path_), *key});
  }
  Ptr reduce(const Ptr& fn, const Ptr& args) {
    const auto* g = std::get_if<Global>(&fn->v);
    if (!g) throw DataError(path_ + ": malformed pickle (call of a non-global)");
    const std::string name = g->module + "." + g->name;
    if (name == "collections.OrderedDict") return make(std::vector<std::pair<Ptr, Ptr>>{});
    const auto& a = tuple(args);
    if (name == "torch._utils._rebuild_parameter" && !a.empty()) return a[0];
    // LibTorch's pickle_save tags typed containers (torch/jit/_pickle.py).
    if (name == "torch.jit._pickle.restore_type_tag" && !a.empty()) return a[0];
    if (name == "torch._utils._rebuild_tensor_v2" && a.size() >= 4) {
      const auto* s = std::get_if<Storage>(&a[0]->v);
      if (!s) throw DataError(path_ + ": malformed pickle (tensor without storage)");
      return make(tensor(*s, integer(a[1]), ints(a[2]), ints(a[3])));
    }
    throw DataError(path_ + ": the pickle calls " + name + ", which a plain state_dict does not hold");
  }
  at::Tensor tensor(const Storage& s, int64_t offset, const std::vector<int64_t>& size, const std::vector<int64_t>& stride) {
    auto it = storages_.find(s.key);
    if (it == storages_.end()) {
      const std::string record = "data/" + s.key;
      if (!zip_.hasRecord(record)) throw DataError(path_ + ": missing tensor data " + record);
      auto [data, bytes] = zip_.getRecord(record);
      const int64_t item = static_cast<int64_t>(c10::elementSize(s.dtype));
      at::Tensor flat = at::empty({static_cast<int64_t>(bytes) / item}, at::TensorOptions().dtype(s.dtype));
      std::memcpy(flat.data_ptr(), data.get(), bytes);
      it = storages_.emplace(s.key, flat).first;
    }
    int64_t extent = offset;
    for (size_t d = 0; d < size.size(); ++d) extent += size[d] > 0 ? (size[d] - 1) * stride[d] : 0;
    if (extent >= it->second.numel() && !(std::find(size.begin(), size.end(), 0) != size.end())) {
      throw DataError(path_ + ": tensor data " + s.key + " is shorter than its shape");
    }
    return it->second.as_strided(size, stride, offset).clone(at::MemoryFormat::Contiguous);
  }

  std::string path_;
  const std::string& p_;
  caffe2::serialize::PyTorchStreamReader& zip_;
  size_t pos_ = 0;
  std::vector<Ptr> stack_;
  std::map<uint64_t, Ptr> memo_;
  std::map<std::string, at::Tensor> storages_;
};

/// The tensors of a dict object, or of its "model" entry.
bool tensors_of(const Ptr& root, std::map<std::string, at::Tensor>& out) {
  const auto* d = std::get_if<std::vector<std::pair<Ptr, Ptr>>>(&root->v);
  if (!d) return false;
  for (const auto& [k, v] : *d) {
    const auto* key = std::get_if<std::string>(&k->v);
    if (key && *key == "model" && tensors_of(v, out)) return true;
  }
  for (const auto& [k, v] : *d) {
    const auto* key = std::get_if<std::string>(&k->v);
    const auto* t = std::get_if<at::Tensor>(&v->v);
    if (key && t) out[*key] = *t;
  }
  return !out.empty();
}

}  // namespace

std::map<std::string, at::Tensor> read_torch_save_state_dict(const std::string& path) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip;
  try {
    zip = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const std::exception& e) {
    std::string why = e.what();
    throw DataError(path + ": is not a torch.save file of PyTorch >= 1.6 (" + why.substr(0, why.find('\n')) + ")");
  }
  if (!zip->hasRecord("data.pkl")) throw DataError(path + ": is not a torch.save file (no data.pkl)");
  auto [data, bytes] = zip->getRecord("data.pkl");
  const std::string pickle(static_cast<const char*>(data.get()), bytes);
  Reader reader(path, pickle, *zip);
  const Ptr root = reader.run();
  std::map<std::string, at::Tensor> out;
  if (!tensors_of(root, out)) throw DataError(path + ": holds no state_dict (a dict of tensors, or one under \"model\")");
  return out;
}

}  // namespace crucible
