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
        /// `Revocations.revokeUser` (reaching what was granted up to `at`); `atApple`: the
        /// user's disconnect, whose refresh tokens from up to `at` are queued for revocation at
        /// Apple first. `clients`: only the sessions and tokens of these client ids (an app
        /// group's consent; nil: all). While held, all of the user's sessions are refused.
        case user(sub: String, source: Revocations.Source, at: Int64, happened: Int64?, forget: Forgetting,
                  event: AppEventKind?, reason: String?, atApple: Bool, clients: [String]? = nil)
        /// A logout: the session with this store key (the SHA-256 of its id, never the id);
        /// its user when known.
        case session(key: String, sub: String?)
        /// Apple's verified email notification: the stored email and its forwarding.
        case email(sub: String, email: String?, privateEmail: Bool?, enabled: Bool, at: Int64?)
        /// Apple's notification as posted, not verified yet (Apple's keys were unreachable):
        /// verified once they answer, then held as what it says (`user` or `email`).
        case notification(body: String)
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
    var deny: Deny? { action.deny }
}

/// The held revocations, oldest first, and the denials they imply: a pure value (the
/// capacity rules and the admission check), kept by `HeldRevocations`.
struct HeldQueue: Sendable {
    /// At most this many are held; one more is refused (answered with the store's failure).
    static let capacity = 10_000
    /// Of which notifications not yet verified (anyone can post one while Apple's keys are
    /// unreachable): their own, smaller bound, so they never crowd out logouts.
    static let unverifiedCapacity = 1_000
    /// A notification body longer than this is not held (Apple's are about 1 KiB): 1,000 of
    /// them fit in 8 MiB of memory and of `store.state_dir`.
    static let bodyLimit = 8 * 1024

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

    var count: Int { entries.count }
    /// When the oldest was received (nil: none held).
    var oldest: Int64? { entries.map(\.received).min() }

    mutating func hold(_ action: HeldRevocation.Action, keep: Int64, now: Int64) -> Holding {
        if let work = action.work, works.contains(work) { return .duplicate }
        if entries.count >= Self.capacity { return .full }
        if case .notification(let body) = action, unverified >= Self.unverifiedCapacity || body.utf8.count > Self.bodyLimit { return .full }
        let entry = HeldRevocation(id: nextID, received: now, keep: keep, action: action)
        nextID += 1
        entries.append(entry)
        index(entry)
        return .held(entry)
    }

    /// The entry is applied (or can never be): it goes, and so does what it denied.
    @discardableResult
    mutating func remove(_ id: Int64) -> HeldRevocation? {
        guard let i = entries.firstIndex(where: { $0.id == id }) else { return nil }
        let entry = entries.remove(at: i)
        if let work = entry.action.work { works.remove(work) }
        if case .notification = entry.action { unverified -= 1 }
        switch entry.deny {
        case .user(let sub, _):
            // The latest of what else is held for the user.
            users[sub] = entries.compactMap { e -> Int64? in
                if case .user(sub, let upTo) = e.deny { upTo } else { nil }
            }.max()
        case .session(let key): sessions.remove(key)
        case nil: break
        }
        return entry
    }

    /// A notification verified: held from now on as what it says, in its place and with its
    /// age (a new id: the journal records the change as that entry held, the old one done).
    mutating func replace(_ id: Int64, with action: HeldRevocation.Action) -> HeldRevocation? {
        guard let i = entries.firstIndex(where: { $0.id == id }), let old = remove(id) else { return nil }
        let entry = HeldRevocation(id: nextID, received: old.received, keep: old.keep, action: action)
        nextID += 1
        entries.insert(entry, at: i)
        index(entry)
        return entry
    }

    /// These go after the others (a replay that ended on them tries the rest first next time:
    /// one that fails for good never holds up what is behind it).
    mutating func moveToBack(_ ids: [Int64]) {
        let moving = entries.filter { ids.contains($0.id) }
        entries.removeAll { ids.contains($0.id) }
        entries += moving
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
        if case .notification = entry.action { unverified += 1 }
        if let work = entry.action.work { works.insert(work) }
    }
}

extension HeldRevocation.Action {
    /// What makes two holdings one: the same logout (a session's key), the same notification
    /// (Apple redelivered its body: its digest); a user's revocations are each their own.
    var work: String? {
        switch self {
        case .session(let key, _): "s" + key
        case .notification(let body): "n" + sha256Hex(body)
        case .user, .email: nil
        }
    }

    /// What this instance refuses while the action is held: a user's sessions up to the
    /// revocation (every one, for an account deleted), or the session logged out. An email
    /// change refuses nothing; neither does a notification until it is verified (anyone can
    /// post one).
    var deny: HeldRevocation.Deny? {
        switch self {
        case .user(let sub, _, let at, _, let forget, _, _, _, _): .user(sub: sub, upTo: forget == .everything ? .max : at)
        case .session(let key, _): .session(key: key)
        case .email, .notification: nil
        }
    }

    /// A log label: what was held (never who, nor the session).
    var kind: String {
        switch self {
        case .user(_, let source, _, _, _, _, _, _, _): "revocation (\(source.rawValue))"
        case .session: "logout"
        case .email: "apple email notification"
        case .notification: "apple notification (not verified yet)"
        }
    }
}

/// Revocations the store did not take, kept until it does: held in memory and, with
/// `store.state_dir`, in its journal (`HeldJournal`, written before the client is answered, read
/// again at start); denied by this instance meanwhile (`denies`, on every admission); applied
/// once the store answers (`replay`, every second while it does, and once more at shutdown),
/// then published to the fleet as any revocation is.
final class HeldRevocations: Sendable {
    /// What a replay of one entry came to: applied; the store failed again; something else must
    /// answer first (Apple's keys: it stays, and so do the other unverified notifications this
    /// pass); verified, to be held as this instead (and applied at once); it can never apply.
    enum Applied: Sendable, Equatable {
        case done, retry, later, drop
        case replace(HeldRevocation.Action)
    }
    /// An action `Revocations.apply` does not do (`AuthCore.apply` does).
    struct NotApplicable: Error {}

    /// A replay stops after this many entries in a row failed: the store is failing again.
    static let failuresInARow = 3

    private struct State {
        var queue: HeldQueue
        /// Held, but not yet in the journal: not replayed until they are (a replay's `done`
        /// must follow its `hold` in the file).
        var unwritten: Set<Int64> = []
    }

    private let state: NIOLockedValueBox<State>
    /// The queue's size, read without the lock by admission (0: nothing to check); stored
    /// under the lock at every change.
    private let held = ManagedAtomic(0)
    private let journal: HeldJournal?
    private let replaying = ManagedAtomic(false)
    private let replayer = NIOLockedValueBox<(@Sendable (HeldRevocation) async -> Applied)?>(nil)
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
        state = NIOLockedValueBox(State(queue: HeldQueue(kept)))
        held.store(kept.count, ordering: .releasing)
        if !kept.isEmpty {
            logger.warning("revocations held by the last run, refused here until the session store takes them",
                           metadata: ["held": .stringConvertible(kept.count), "state_dir": "\(journal?.directory ?? "-")"])
        }
        recordMetrics()
    }

    /// How `replay` applies an entry (`AuthCore.replay`): set once the core is built.
    func setApply(_ apply: @escaping @Sendable (HeldRevocation) async -> Applied) {
        replayer.withLockedValue { $0 = apply }
    }

    var isEmpty: Bool { held.load(ordering: .acquiring) == 0 }
    var count: Int { held.load(ordering: .acquiring) }
    var entries: [HeldRevocation] { state.withLockedValue { $0.queue.entries } }

    /// Whether a held revocation reaches this session: admission refuses it (from the local
    /// cache, which keeps it: the store may not answer).
    func denies(key: String, sub: String, created: Int64) -> Bool {
        guard !isEmpty else { return false }
        return state.withLockedValue { $0.queue.denies(key: key, sub: sub, created: created) }
    }

    /// Whether the session with this store key was logged out: refused before the store is asked.
    func denies(key: String) -> Bool {
        guard !isEmpty else { return false }
        return state.withLockedValue { $0.queue.denies(key: key) }
    }

    private func change<T>(_ body: (inout State) -> T) -> T {
        state.withLockedValue { state in
            defer { held.store(state.queue.count, ordering: .releasing) }
            return body(&state)
        }
    }

    /// Keeps `action` (on disk first, when there is a journal) until the store takes it:
    /// true once kept (or already held), false when the queue is full or the journal could not
    /// be written — the caller then answers with the store's failure.
    func hold(_ action: HeldRevocation.Action, keep: Int64, why: any Error) async -> Bool {
        let outcome = change { state -> HeldQueue.Holding in
            let outcome = state.queue.hold(action, keep: keep, now: now())
            if case .held(let entry) = outcome { state.unwritten.insert(entry.id) }
            return outcome
        }
        switch outcome {
        case .duplicate:
            return true
        case .full:
            metrics.recordHeldRevocation(.refused)
            logger.error("a revocation the session store did not take was refused: the held queue is full; the client is answered 503",
                         metadata: ["held": .stringConvertible(count), "kind": "\(action.kind)", "error": "\(why)"])
            return false
        case .held(let entry):
            // Denied from now on.
            if let journal {
                do {
                    try await NIOThreadPool.singleton.runIfActive { try journal.append(.hold(entry)) }
                } catch {
                    change { state in
                        state.unwritten.remove(entry.id)
                        state.queue.remove(entry.id)
                    }
                    metrics.recordHeldRevocation(.refused)
                    logger.error("a revocation the session store did not take could not be written to store.state_dir: the client is answered 503",
                                 metadata: ["state_dir": "\(journal.directory)", "error": "\(error)"])
                    return false
                }
            }
            change { _ = $0.unwritten.remove(entry.id) }
            metrics.recordHeldRevocation(.held)
            recordMetrics()
            logger.warning("the session store did not take a revocation: held, refused here, applied once the store answers",
                           metadata: ["kind": "\(entry.action.kind)", "held": .stringConvertible(count), "error": "\(why)"])
            return true
        }
    }

    /// Applies what is held, oldest first. An entry the store fails again stays and the next
    /// is tried, until `giveUpAfter` fail in a row (the store is down again: the rest waits for
    /// the next pass). One replay at a time.
    func replay(giveUpAfter limit: Int = failuresInARow) async {
        guard !isEmpty, let apply = replayer.withLockedValue({ $0 }),
              replaying.compareExchange(expected: false, desired: true, ordering: .acquiring).exchanged else { return }
        defer { replaying.store(false, ordering: .releasing) }
        var failed: [Int64] = []
        var keysUnavailable = false
        let pass = state.withLockedValue { state in state.queue.entries.filter { !state.unwritten.contains($0.id) } }
        for var entry in pass {
            if case .notification = entry.action, keysUnavailable { continue }
            var applied = await apply(entry)
            if case .replace(let action) = applied {
                guard let replacement = await replace(entry, with: action) else { continue }
                entry = replacement
                applied = await apply(entry)
            }
            if applied == .done || applied == .drop {
                failed = []
                await finish(entry, applied: applied == .done)
            } else if applied == .later {
                keysUnavailable = true
            } else if applied == .retry {
                failed.append(entry.id)
                if failed.count >= limit {
                    // The store is failing again, or these fail for good: either way the rest
                    // is tried first next time.
                    change { $0.queue.moveToBack(failed) }
                    break
                }
            }
        }
    }

    private func replace(_ entry: HeldRevocation, with action: HeldRevocation.Action) async -> HeldRevocation? {
        guard let replacement = change({ $0.queue.replace(entry.id, with: action) }) else { return nil }
        if let journal {
            // The verified form first: a crash between the two lines replays both (idempotent).
            try? await NIOThreadPool.singleton.runIfActive {
                try journal.append(.hold(replacement))
                try journal.append(.done(entry.id))
            }
        }
        logger.info("a held notification was verified: held as what it says", metadata: ["kind": "\(action.kind)"])
        return replacement
    }

    private func finish(_ entry: HeldRevocation, applied: Bool) async {
        change { _ = $0.queue.remove(entry.id) }
        recordMetrics()  // before the log line: what it says is what the gauges say
        metrics.recordHeldRevocation(applied ? .applied : .dropped)
        let waited = max(0, now() - entry.received)
        if applied {
            logger.info("a held revocation was applied", metadata: ["kind": "\(entry.action.kind)", "held_ms": .stringConvertible(waited)])
        } else {
            logger.warning("a held notification was dropped: it does not verify", metadata: ["held_ms": .stringConvertible(waited)])
        }
        guard let journal else { return }
        try? await NIOThreadPool.singleton.runIfActive {
            try journal.append(.done(entry.id))
            try journal.compact { self.entries }
        }
    }

    /// At shutdown: what is still held is said (kept on disk, or lost without a state directory).
    func close() {
        defer { journal?.close() }
        let left = count
        guard left > 0 else { return }
        if let journal {
            logger.warning("revocations still held at shutdown: kept in store.state_dir, applied after the next start there",
                           metadata: ["held": .stringConvertible(left), "state_dir": "\(journal.directory)"])
        } else {
            logger.error("revocations still held at shutdown are lost (set store.state_dir to keep them across restarts)",
                         metadata: ["held": .stringConvertible(left)])
        }
    }

    func recordMetrics() {
        let (depth, oldest) = state.withLockedValue { ($0.queue.count, $0.queue.oldest) }
        metrics.recordHeldRevocations(depth: depth, oldestSeconds: oldest.map { max(0, now() - $0) / 1000 } ?? 0)
    }
}
