import NIOCore
import Sessions

/// The session store for async code: every call answers within `store.timeout` or throws
/// `SessionStoreError` (the deadline is inside; callers never bridge futures themselves).
struct BoundedStore: Sendable {
    let core: AuthCore
    let loop: any EventLoop

    private func bounded<T: Sendable>(_ future: EventLoopFuture<T>) async throws -> T {
        try await core.withDeadline(future, on: loop).get()
    }

    func load(_ handle: SessionHandle) async throws -> StoredSession? { try await bounded(core.store.load(handle, on: loop)) }
    func sessions(of sub: String) async throws -> [SessionRecord] { try await bounded(core.store.sessions(of: sub, on: loop)) }
    func profile(of sub: String) async throws -> UserProfile? { try await bounded(core.store.profile(of: sub, on: loop)) }
    func saveProfile(_ profile: UserProfile) async throws { try await bounded(core.store.saveProfile(profile, on: loop)) }
    func putLogin(state: String, _ login: LoginState, ttl: Int64) async throws { try await bounded(core.store.putLogin(state: state, login, ttl: ttl, on: loop)) }
    func takeLogin(state: String) async throws -> LoginState? { try await bounded(core.store.takeLogin(state: state, on: loop)) }
    func putNonce(_ hash: String, clientID: String, ttl: Int64) async throws { try await bounded(core.store.putNonce(hash, clientID: clientID, ttl: ttl, on: loop)) }
    func takeNonce(_ hash: String) async throws -> String? { try await bounded(core.store.takeNonce(hash, on: loop)) }
    func claim(_ claim: Claim, ttl: Int64) async throws -> Bool { try await bounded(core.store.claim(claim, ttl: ttl, on: loop)) }
    func release(_ claim: Claim) async throws { try await bounded(core.store.release(claim, on: loop)) }
    func link(_ sub: String, to account: String) async throws -> LinkResult { try await bounded(core.store.link(sub, to: account, on: loop)) }
    func unlink(_ sub: String) async throws -> String? { try await bounded(core.store.unlink(sub, on: loop)) }
    func account(linkedTo sub: String) async throws -> String? { try await bounded(core.store.account(linkedTo: sub, on: loop)) }
    func transfer(_ id: String) async throws -> TransferRecord? { try await bounded(core.store.transfer(id, on: loop)) }
}
