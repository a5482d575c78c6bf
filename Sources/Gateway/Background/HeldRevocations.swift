import Atomics
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Sessions

/// A revocation the store did not take (it did not answer, or refused the write): what to do
/// once it answers, and what this instance refuses until then.
struct HeldRevocation: Codable, Sendable, Equatable {
    enum Action: Codable, Sendable, Equatable {
        /// `Revocations.revokeUser`; `atApple`: the user's disconnect, whose refresh tokens are
        /// queued for revocation at Apple first.
        case user(sub: String, source: Revocations.Source, at: Int64, happened: Int64?, forget: Forgetting,
                  event: AppEventKind?, reason: String?, atApple: Bool)
        /// A logout: the session with this store key (the SHA-256 of its id, never the id);
        /// its user when known.
        case session(key: String, sub: String?)
        /// Apple's notification, its body as posted, acted on again from the start (verified,
        /// its `jti` claimed); `verified`: it was (its claim may be ours), else Apple's keys were
        /// unreachable and it is verified once they answer.
        case notification(body: String, verified: Bool)
    }

    /// What this instance refuses until the revocation is applied.
    enum Deny: Codable, Sendable, Equatable {
        /// The user's sessions created up to `upTo` (Unix ms).
        case user(sub: String, upTo: Int64)
        /// One session, by its store key.
        case session(key: String)
    }

    var id: Int64
    /// When it was received (Unix ms): its age is a metric.
    var received: Int64
    /// How long the store keeps the revocation once applied (the absolute session timeout).
    var keep: Int64
    var action: Action
    var deny: Deny?
}

/// The held revocations, oldest first, and the denials they imply: a pure value (the
/// capacity rules and the admission check), kept by `HeldRevocations`.
struct HeldQueue: Sendable {
    /// At most this many are held; one more is refused (answered with the store's failure).
    static let capacity = 10_000
    /// Of which notifications not yet verified (anyone can post one while Apple's keys are
    /// unreachable): their own, smaller bound, so they never crowd out logouts.
    static let unverifiedCapacity = 1_000

    private(set) var entries: [HeldRevocation] = []
    private var users: [String: Int64] = [:]
    private var sessions: Set<String> = []
    /// `Action.work` of each entry: the duplicates.
    private var works: Set<String> = []
    private var unverified = 0
    private var nextID: Int64 = 1

    enum Holding: Equatable {
        case held(HeldRevocation)
        /// The same logout or the same notification is held already: nothing more to keep.
        case duplicate
        case full
    }

    init(_ entries: [HeldRevocation] = []) {
        self.entries = entries
        nextID = (entries.map(\.id).max() ?? 0) + 1
        entries.forEach { index($0) }
    }

    var isEmpty: Bool { entries.isEmpty }
    var count: Int { entries.count }
    /// When the oldest was received (nil: none held).
    var oldest: Int64? { entries.first?.received }

    mutating func hold(_ action: HeldRevocation.Action, deny: HeldRevocation.Deny?, keep: Int64, now: Int64) -> Holding {
        if let work = action.work, works.contains(work) { return .duplicate }
        if entries.count >= Self.capacity { return .full }
        if case .notification(_, verified: false) = action, unverified >= Self.unverifiedCapacity { return .full }
        let entry = HeldRevocation(id: nextID, received: now, keep: keep, action: action, deny: deny)
        nextID += 1
        entries.append(entry)
        index(entry)
        return .held(entry)
    }

    /// The entry is applied (or can never be): it goes, and so does what it denied.
    mutating func remove(_ id: Int64) {
        guard let i = entries.firstIndex(where: { $0.id == id }) else { return }
        let entry = entries.remove(at: i)
        if let work = entry.action.work { works.remove(work) }
        if case .notification(_, verified: false) = entry.action { unverified -= 1 }
        switch entry.deny {
        case .user(let sub, _):
            // The latest of what else is held for the user.
            users[sub] = entries.compactMap { e -> Int64? in
                if case .user(sub, let upTo) = e.deny { upTo } else { nil }
            }.max()
        case .session(let key): sessions.remove(key)
        case nil: break
        }
    }

    /// Whether a held revocation reaches this session (`key`, of `sub`, created at `created`).
    func denies(key: String, sub: String, created: Int64) -> Bool {
        if denies(key: key) { return true }
        if let upTo = users[sub], created <= upTo { return true }
        return false
    }

    /// Whether the session with this store key was logged out.
    func denies(key: String) -> Bool { sessions.contains(key) }

    private mutating func index(_ entry: HeldRevocation) {
        switch entry.deny {
        case .user(let sub, let upTo): users[sub] = max(users[sub] ?? .min, upTo)
        case .session(let key): sessions.insert(key)
        case nil: break
        }
        if case .notification(_, verified: false) = entry.action { unverified += 1 }
        if let work = entry.action.work { works.insert(work) }
    }
}

extension HeldRevocation.Action {
    /// What makes two holdings one: the same logout (a session's key), the same notification
    /// (Apple redelivered its body); a user's revocations are each their own.
    var work: String? {
        switch self {
        case .session(let key, _): "s" + key
        case .notification(let body, _): "n" + body
        case .user: nil
        }
    }
}

/// Revocations the store did not take, kept until it does: held in memory and, with
/// `store.state_dir`, in its journal (`HeldJournal`, written before the client is answered, read
/// again at start); denied by this instance meanwhile (`denies`, on every admission); applied
/// in order once the store answers (`replay`, after each good store ping), then published to
/// the fleet as any revocation is.
final class HeldRevocations: Sendable {
    /// What a replay of one entry came to: applied; the store failed again (the replay stops:
    /// what follows waits with it); something else must answer first (Apple's keys: the entry
    /// stays, the replay goes on); it can never apply (dropped).
    enum Applied: Sendable { case done, retry, later, drop }
    /// An action `Revocations.apply` does not do (a notification is `AuthCore`'s).
    struct NotApplicable: Error {}

    private let queue: NIOLockedValueBox<HeldQueue>
    /// The queue's size, read without the lock by admission (0: nothing to check).
    private let held = ManagedAtomic(0)
    private let journal: HeldJournal?
    private let replaying = ManagedAtomic(false)
    let metrics: GatewayMetrics
    let logger: Logger
    let now: @Sendable () -> Int64

    /// - Parameter journal: nil: held in memory only (a restart before the store answers loses them).
    init(journal: HeldJournal?, metrics: GatewayMetrics, logger: Logger, now: @escaping @Sendable () -> Int64) throws {
        let kept = try journal?.load() ?? []
        self.journal = journal
        self.metrics = metrics
        self.logger = logger
        self.now = now
        queue = NIOLockedValueBox(HeldQueue(kept))
        held.store(kept.count, ordering: .releasing)
        if !kept.isEmpty {
            logger.warning("revocations held by the last run, refused here until the session store takes them",
                           metadata: ["held": .stringConvertible(kept.count), "state_dir": "\(journal?.directory ?? "-")"])
        }
        recordMetrics()
    }

    var isEmpty: Bool { held.load(ordering: .acquiring) == 0 }
    var count: Int { held.load(ordering: .acquiring) }
    var entries: [HeldRevocation] { queue.withLockedValue { $0.entries } }
    var journalDirectory: String? { journal?.directory }

    /// Whether a held revocation reaches this session: admission refuses it (from the local
    /// cache, which keeps it: the store may not answer).
    func denies(key: String, sub: String, created: Int64) -> Bool {
        guard !isEmpty else { return false }
        return queue.withLockedValue { $0.denies(key: key, sub: sub, created: created) }
    }

    /// Whether the session with this store key was logged out: refused before the store is asked.
    func denies(key: String) -> Bool {
        guard !isEmpty else { return false }
        return queue.withLockedValue { $0.denies(key: key) }
    }

    /// Keeps `action` (on disk first, when there is a journal) until the store takes it:
    /// true once kept (or already held), false when the queue is full or the journal could not
    /// be written — the caller then answers with the store's failure.
    func hold(_ action: HeldRevocation.Action, deny: HeldRevocation.Deny?, keep: Int64, why: any Error) async -> Bool {
        let outcome = queue.withLockedValue { $0.hold(action, deny: deny, keep: keep, now: now()) }
        switch outcome {
        case .duplicate:
            return true
        case .full:
            metrics.recordHeldRevocation(.refused)
            logger.error("a revocation the session store did not take was refused: the held queue is full; the client is answered 503",
                         metadata: ["held": .stringConvertible(count), "error": "\(why)"])
            return false
        case .held(let entry):
            held.wrappingIncrement(ordering: .releasing)  // denied from now on
            if let journal {
                do {
                    try await NIOThreadPool.singleton.runIfActive { try journal.append(.hold(entry)) }
                } catch {
                    queue.withLockedValue { $0.remove(entry.id) }
                    held.wrappingDecrement(ordering: .releasing)
                    metrics.recordHeldRevocation(.refused)
                    logger.error("a revocation the session store did not take could not be written to store.state_dir: the client is answered 503",
                                 metadata: ["state_dir": "\(journal.directory)", "error": "\(error)"])
                    return false
                }
            }
            metrics.recordHeldRevocation(.held)
            recordMetrics()
            logger.warning("the session store did not take a revocation: held, refused here, applied once the store answers",
                           metadata: ["kind": "\(entry.action.kind)", "held": .stringConvertible(count), "error": "\(why)"])
            return true
        }
    }

    /// Applies what is held, oldest first, with `apply`; stops at the first the store fails
    /// again. One replay at a time.
    func replay(_ apply: @Sendable (HeldRevocation) async -> Applied) async {
        guard !isEmpty, replaying.compareExchange(expected: false, desired: true, ordering: .acquiring).exchanged else { return }
        defer { replaying.store(false, ordering: .releasing) }
        for entry in entries {
            let applied = await apply(entry)
            if applied == .retry { break }
            if applied == .later { continue }
            queue.withLockedValue { $0.remove(entry.id) }
            held.wrappingDecrement(ordering: .releasing)
            metrics.recordHeldRevocation(applied == .done ? .applied : .dropped)
            let waited = max(0, now() - entry.received)
            if applied == .done {
                logger.info("a held revocation was applied", metadata: ["kind": "\(entry.action.kind)", "held_ms": .stringConvertible(waited)])
            } else {
                logger.warning("a held notification was dropped: it can never be verified", metadata: ["held_ms": .stringConvertible(waited)])
            }
            if let journal {
                let empty = isEmpty
                try? await NIOThreadPool.singleton.runIfActive { try journal.append(.done(entry.id)) }
                if empty { try? await NIOThreadPool.singleton.runIfActive { try journal.clear(if: { self.isEmpty }) } }
            }
        }
        recordMetrics()
    }

    /// At shutdown: what is still held is said (kept on disk, or lost without a state directory).
    func close() {
        defer { journal?.close() }
        let left = count
        guard left > 0 else { return }
        if let journal {
            logger.warning("revocations still held at shutdown: kept in store.state_dir, applied after the next start",
                           metadata: ["held": .stringConvertible(left), "state_dir": "\(journal.directory)"])
        } else {
            logger.error("revocations still held at shutdown are lost (set store.state_dir to keep them across restarts)",
                         metadata: ["held": .stringConvertible(left)])
        }
    }

    func recordMetrics() {
        let (depth, oldest) = queue.withLockedValue { ($0.count, $0.oldest) }
        metrics.recordHeldRevocations(depth: depth, oldestSeconds: oldest.map { max(0, now() - $0) / 1000 } ?? 0)
    }
}

extension HeldRevocation.Action {
    /// What this instance refuses while the action is held: a user's sessions up to the
    /// revocation (every one, for an account deleted), or the session logged out. A
    /// notification's is known once it is verified (`AppleNotificationIntake`).
    var deny: HeldRevocation.Deny? {
        switch self {
        case .user(let sub, _, let at, _, let forget, _, _, _): .user(sub: sub, upTo: forget == .everything ? .max : at)
        case .session(let key, _): .session(key: key)
        case .notification: nil
        }
    }

    /// A log label: what was held (never who, nor the session).
    var kind: String {
        switch self {
        case .user(_, let source, _, _, _, _, _, _): "revocation (\(source.rawValue))"
        case .session: "logout"
        case .notification(_, let verified): verified ? "apple notification" : "apple notification (not verified yet)"
        }
    }
}
