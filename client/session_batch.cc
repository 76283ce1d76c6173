// Session's batch calls (see session.h): AllocateMany, PublishMany, AcquireMany, TakeMany,
// each one Session-stream message each way; LeaseAdopter::AdoptBatch fetches the buffers
// they map together. AllocateMany's requests and recycled buffers are the
// ProducerAllocator's; the consumers' views are ordered on their stream before they return.
#include <functional>
#include <string>
#include <utility>

#include "client/cancel_state.h"
#include "client/session.h"
#include "client/tensor_convert.h"
#include "common/status.h"

namespace tensord::internal {
namespace {

// The elements of a batch that failed, in index order.
class Failures {
 public:
  void Add(size_t index, absl::Status status) { failed_.emplace_back(index, std::move(status)); }
  bool empty() const { return failed_.empty(); }
  // The first failure's code and reason, named by `what`, and how many others failed.
  absl::Status Error(const std::function<std::string(size_t)>& what,
                     std::string_view note = "") const {
    const auto& [index, status] = failed_.front();
    std::string message = what(index) + ": " + std::string(status.message());
    if (failed_.size() > 1) {
      message += " (" + std::to_string(failed_.size() - 1) + " other element" +
                 (failed_.size() > 2 ? "s" : "") + " failed too)";
    }
    message += note;
    return absl::Status(status.code(), message);
  }

 private:
  std::vector<std::pair<size_t, absl::Status>> failed_;
};

// Checks the replies to a publish batch: infos[i] gets element i's tensor as the broker
// bound it, each failure goes to `failed`; returns how many elements the broker bound (one
// whose reply fails the check included).
size_t CollectPublished(const std::vector<absl::StatusOr<tensord::v1::SessionResponse>>& replies,
                        std::vector<TensorInfo>& infos, Failures& failed) {
  size_t published = 0;
  for (size_t i = 0; i < replies.size(); ++i) {
    if (!replies[i].ok()) {
      failed.Add(i, replies[i].status());
      continue;
    }
    if (!replies[i]->has_publish()) {
      failed.Add(i, absl::InternalError("the broker answered with something else"));
      continue;
    }
    ++published;  // bound at the broker, whatever the check below says
    absl::StatusOr<ValidatedTensor> valid = ValidateTensorInfo(replies[i]->publish().tensor(), "the published tensor");
    if (!valid.ok()) {
      failed.Add(i, valid.status());
      continue;
    }
    infos[i] = std::move(valid->info);
  }
  return published;
}

std::string ElementOf(std::string_view verb, size_t index, size_t count) {
  return std::string(verb) + " element " + std::to_string(index) + " of " + std::to_string(count);
}

}  // namespace

absl::StatusOr<std::vector<LeaseView*>> Session::AllocateMany(
    const std::vector<AllocateItem>& items) {
  TENSORD_RETURN_IF_ERROR(CheckOpen());
  const size_t n = items.size();
  auto what = [&](size_t i) {
    return ElementOf("allocate", i, n) + " in '" + items[i].ns + "'";
  };
  std::vector<tensord::v1::SessionRequest> requests;
  requests.reserve(n);
  std::vector<std::shared_ptr<Mapping>> reusable;  // mapped until the answers are adopted
  for (size_t i = 0; i < n; ++i) {
    // A spec refused here sends nothing at all.
    TENSORD_ASSIGN_OR_RETURN(tensord::v1::SessionRequest request, allocator_.BatchRequest(items[i], what(i), reusable));
    requests.push_back(std::move(request));
  }
  std::vector<LeaseView*> views(n, nullptr);
  if (n == 0) return views;
  std::vector<absl::StatusOr<tensord::v1::SessionResponse>> replies =
      channel_.StreamCallMany(std::move(requests), kDefaultCallTimeout);
  Failures failed;
  std::vector<Grant> grants;
  for (size_t i = 0; i < n; ++i) {
    if (!replies[i].ok()) {
      failed.Add(i, replies[i].status());
    } else if (!replies[i]->has_allocate()) {
      failed.Add(i, absl::InternalError("the broker answered with something else"));
    } else {
      grants.push_back(Grant{i, replies[i]->allocate().lease_id(), &replies[i]->allocate().tensor(), {}});
    }
  }
  if (!failed.empty()) {
    std::vector<uint64_t> leases;
    for (const Grant& grant : grants) leases.push_back(grant.lease_id);
    adopter_.AbandonBatch({}, leases);
    return failed.Error(what);
  }
  TENSORD_RETURN_IF_ERROR(adopter_.AdoptBatch(grants, ViewKind::kProducer, nullptr, what, views));
  for (const Grant& grant : grants) {
    allocator_.KeepRecycled(items[grant.index].ns, replies[grant.index]->allocate(), *views[grant.index]);
  }
  return views;
}

absl::StatusOr<std::vector<TensorInfo>> Session::PublishMany(
    const std::vector<PublishTarget>& items) {
  TENSORD_RETURN_IF_ERROR(CheckOpen());
  const size_t n = items.size();
  auto what = [&](size_t i) {
    return ElementOf("publish", i, n) + " (tensor " + std::to_string(items[i].view->tensor_id()) +
           " as '" + items[i].name + "')";
  };
  std::vector<tensord::v1::SessionRequest> requests;
  requests.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    // One element refused here sends nothing at all.
    TENSORD_ASSIGN_OR_RETURN(
        tensord::v1::SessionRequest request,
        PublishRequest(*items[i].view, items[i].name, items[i].options, what(i)));
    requests.push_back(std::move(request));
  }
  std::vector<TensorInfo> infos(n);
  if (n == 0) return infos;
  std::vector<absl::StatusOr<tensord::v1::SessionResponse>> replies =
      channel_.StreamCallMany(std::move(requests), kDefaultCallTimeout);
  Failures failed;
  const size_t published = CollectPublished(replies, infos, failed);
  if (!failed.empty()) {
    // A binding cannot be taken back without losing the one it replaced: say what stuck.
    std::string note;
    if (published > 0) {
      note = "; " + std::to_string(published) + " element" + (published > 1 ? "s" : "") +
             " of the batch " + (published > 1 ? "were" : "was") + " published";
    }
    return failed.Error(what, note);
  }
  return infos;
}

absl::StatusOr<std::vector<LeaseView*>> Session::AcquireMany(const std::vector<std::string>& names,
                                                             const AcquireOptions& options) {
  TENSORD_RETURN_IF_ERROR(CheckOpen());
  const ViewKind kind = ConsumerViewKind(options);
  const size_t n = names.size();
  auto what = [&](size_t i) { return ElementOf("acquire", i, n) + " '" + names[i] + "'"; };
  std::vector<LeaseView*> views(n, nullptr);
  // Lease-cache hits need no request; the misses go out together.
  std::vector<size_t> asked;
  std::vector<tensord::v1::SessionRequest> requests;
  for (size_t i = 0; i < n; ++i) {
    if (LeaseView* hit = leases_.FindByName(names[i], kind, options.min_generation)) {
      views[i] = hit;
      continue;
    }
    asked.push_back(i);
    requests.push_back(AcquireRequest(names[i], options));
  }
  if (requests.empty()) return LeaseAdopter::Ordered(std::move(views), options.stream);
  std::vector<absl::StatusOr<tensord::v1::SessionResponse>> replies =
      channel_.StreamCallMany(std::move(requests), RpcChannel::ReplyBound(options.wait),
                              CancelState::Of(options.cancel));
  Failures failed;
  std::vector<Grant> grants;
  for (size_t k = 0; k < asked.size(); ++k) {
    const size_t i = asked[k];
    if (!replies[k].ok()) {
      failed.Add(i, replies[k].status());
    } else if (!replies[k]->has_acquire()) {
      failed.Add(i, absl::InternalError("the broker answered with something else"));
    } else {
      grants.push_back(Grant{i, replies[k]->acquire().lease_id(), &replies[k]->acquire().tensor(),
                             GrantedFence::Of(replies[k]->acquire())});
    }
  }
  if (!failed.empty()) {
    std::vector<uint64_t> leases;
    for (const Grant& grant : grants) leases.push_back(grant.lease_id);
    adopter_.AbandonBatch(views, leases);
    return failed.Error(what);
  }
  TENSORD_RETURN_IF_ERROR(adopter_.AdoptBatch(grants, kind, &names, what, views));
  return LeaseAdopter::Ordered(std::move(views), options.stream);
}

absl::StatusOr<std::vector<tensord::v1::SessionRequest>> Session::TakeRequests(const std::string& target,
                                                                              size_t max_count,
                                                                              const TakeOptions& options) const {
  const Wait& wait = options.wait;
  if (max_count == 0 || max_count > kMaxTakeBatch) {
    return absl::InvalidArgumentError("take of up to " + std::to_string(max_count) + " from '" +
                                      target + "': between 1 and " +
                                      std::to_string(kMaxTakeBatch) + " per batch");
  }
  std::vector<tensord::v1::SessionRequest> requests(max_count);
  tensord::v1::TakeRequest prepared;
  TENSORD_RETURN_IF_ERROR(PrepareTake(ConsumerViewKind(options), "take from '" + target + "'", prepared));
  for (size_t i = 0; i < max_count; ++i) {
    tensord::v1::TakeRequest* take = requests[i].mutable_take();
    *take = prepared;
    take->set_name_or_prefix(target);
    // Only the first waits: the batch is what is there once something is.
    if (i == 0 && wait.forever()) {
      take->set_forever(true);
    } else if (i == 0 && wait.millis() > 0) {
      take->set_timeout_ms(static_cast<uint64_t>(wait.millis()));
    }
  }
  return requests;
}

absl::StatusOr<std::vector<LeaseView*>> Session::TakeMany(std::string_view name_or_prefix,
                                                          size_t max_count, const TakeOptions& options) {
  TENSORD_RETURN_IF_ERROR(CheckOpen());
  const std::string target(name_or_prefix);
  TENSORD_ASSIGN_OR_RETURN(std::vector<tensord::v1::SessionRequest> requests,
                           TakeRequests(target, max_count, options));
  std::vector<absl::StatusOr<tensord::v1::SessionResponse>> replies = channel_.StreamCallMany(
      std::move(requests), RpcChannel::ReplyBound(options.wait), CancelState::Of(options.cancel));
  std::vector<Grant> grants;
  std::optional<absl::Status> first_error;
  for (auto& reply : replies) {
    if (!reply.ok()) {
      // The rest found the queue empty (NOT_FOUND): expected, not an error of the batch.
      if (!first_error) first_error = reply.status();
      continue;
    }
    if (!reply->has_take()) {
      if (!first_error) first_error = absl::InternalError("the broker answered with something else");
      continue;
    }
    // Unbound now: a cached lease of the name must not serve it any more.
    ForgetName(reply->take().tensor().name());
    grants.push_back(Grant{grants.size(), reply->take().lease_id(), &reply->take().tensor(), GrantedFence::Of(reply->take())});
  }
  auto what = [&](size_t i) { return ElementOf("take", i, grants.size()) + " from '" + target + "'"; };
  if (grants.empty()) {
    return absl::Status(first_error->code(), "take from '" + target + "': " + std::string(first_error->message()));
  }
  std::vector<LeaseView*> views(grants.size(), nullptr);
  TENSORD_RETURN_IF_ERROR(adopter_.AdoptBatch(grants, ConsumerViewKind(options), nullptr, what, views));
  return LeaseAdopter::Ordered(std::move(views), kLegacyDefaultStream);
}

}  // namespace tensord::internal
