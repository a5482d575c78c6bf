import NIOCore
import NIOPosix
import Sessions
import Testing

/// The move of a transferred user (TN3159), as `migrate import` and a sign-in run it, on the
/// memory store with the caller's clock.
@Suite("transfer arrival")
struct TransferArrivalTests {
    let store = MemorySessionStore()
    let loop = MultiThreadedEventLoopGroup.singleton.next()
    static let day: Int64 = 86_400_000

    @Test("a user this store knew moves with their profile, link and the end of their old sessions, once")
    func knownUser() async throws {
        let t = SessionClock.now()
        let handle = keys.newSession(for: "old").handle
        try await store.create(SessionRecord(handle: handle, sub: "old", clientID: "web", created: t - 1000, lastSeen: t - 1000, validatedAt: t - 1000, sealedRefreshToken: nil),
                               profile: UserProfile(sub: "old"), expiresAt: t + Self.day, on: loop).get()
        try await store.saveProfile(UserProfile(sub: "old", name: "Pat", email: "pat@example.org", emailVerified: true, privateEmail: false), on: loop).get()
        _ = try await store.link("old", to: "acct-pat", on: loop).get()
        try await store.putTransfer(TransferRecord(id: "T1", from: "old"), on: loop).get()
        let record = try #require(try await store.transfer("T1", on: loop).get())

        let outcome = try await TransferArrival.apply(record, to: "new", email: nil, privateEmail: false, exported: nil, store: store, at: t, keep: Self.day, on: loop)
        #expect(outcome == TransferArrival.Outcome(sessionsEnded: 1, account: "acct-pat", linkConflict: false))
        let profile = try await store.profile(of: "new", on: loop).get()
        #expect(profile == UserProfile(sub: "new", name: "Pat", email: "pat@example.org", emailVerified: true, privateEmail: false, formerSub: "old",
                                       transferredAt: t), "the app is told the former sub for the transfer period from now")
        #expect(try await store.account(linkedTo: "new", on: loop).get() == "acct-pat")
        #expect(try await store.account(linkedTo: "old", on: loop).get() == nil, "the link moved")
        #expect(try await store.profile(of: "old", on: loop).get() == nil, "the old identity is forgotten")
        #expect(try await store.load(handle, on: loop).get() == nil, "its session ended")
        #expect(try await store.transfer("T1", on: loop).get() == TransferRecord(id: "T1", from: "old", to: "new", mappedAt: t), "mapped at the caller's time")

        let again = try await TransferArrival.apply(record, to: "new", email: nil, privateEmail: false, exported: nil, store: store, at: t + 1, keep: Self.day, on: loop)
        #expect(again == TransferArrival.Outcome(alreadyMapped: true), "a second mover finds it done (and has nothing to announce)")
        #expect(try await store.transfer("T1", on: loop).get()?.mappedAt == t)
    }

    @Test("a user from another store arrives with the file's line; Apple's new relay address wins over it; a new identity linked elsewhere keeps its link")
    func exportedUser() async throws {
        let t = SessionClock.now()
        let line = TransferArrival.Exported(account: "acct-1", name: "Sam", email: "sam@example.org", emailVerified: true, realUserStatus: 2)
        _ = try await store.link("new", to: "acct-other", on: loop).get()
        let outcome = try await TransferArrival.apply(TransferRecord(id: "T2"), to: "new", email: "x@privaterelay.appleid.com", privateEmail: true, exported: line,
                                                      store: store, at: t, keep: Self.day, on: loop)
        #expect(outcome == TransferArrival.Outcome(sessionsEnded: 0, account: nil, linkConflict: true))
        #expect(try await store.profile(of: "new", on: loop).get()
                == UserProfile(sub: "new", name: "Sam", email: "x@privaterelay.appleid.com", emailVerified: true, privateEmail: true, realUserStatus: 2))
        #expect(try await store.account(linkedTo: "new", on: loop).get() == "acct-other")
        #expect(try await store.transfer("T2", on: loop).get()?.to == "new")
    }

    @Test("while another process holds the user's claim, nothing moves")
    func claimed() async throws {
        #expect(try await store.claim(.transfer(id: "T3"), ttl: 60_000, on: loop).get())
        let outcome = try await TransferArrival.apply(TransferRecord(id: "T3"), to: "new", email: nil, privateEmail: false, exported: nil, store: store,
                                                      at: SessionClock.now(), keep: Self.day, on: loop)
        #expect(outcome == nil)
        #expect(try await store.transfer("T3", on: loop).get() == nil)
    }
}
