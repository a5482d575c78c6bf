import GatewayConfig
import Sessions

/// The recipient team's half of a transfer.
extension Migration {
    /// Loads every line of `file` into the store (so a sign-in can map anyone the batch does not
    /// reach), then exchanges each transfer id not yet mapped for the user's `sub` here and moves
    /// the user to it, telling the app (`user.transferred`). Resumable: mapped lines are skipped.
    /// The file is read whole first: a malformed line stops the import before anything changes.
    public func importFile(_ file: String) async throws -> ImportReport {
        var rows: [TransferLine] = []
        var seen = Set<String>()
        for (number, line) in try TransferLine.lines(of: file) {
            switch TransferLine.parse(line) {
            case .success(let row): if seen.insert(row.transferSubject).inserted { rows.append(row) }
            case .failure(let error): throw MigrationError("\(file):\(number): \(error); nothing was imported")
            }
        }
        var report = ImportReport()
        var pending: [TransferLine] = []
        for row in rows {
            let record = try await store.transfer(row.transferSubject, on: loop).get()
            if let to = record?.to {
                report.alreadyMapped += 1
                note(row, record: record, to: to, in: &report)
                continue
            }
            try await store.putTransfer(TransferRecord(id: row.transferSubject, data: row.json), on: loop).get()
            pending.append(row)
        }
        guard !pending.isEmpty else { return report }
        let token = AccessToken()
        for row in pending {
            let (outcome, calls) = try await callWithAccess(token) { [tokens, clientID] access in
                await tokens.exchange(transferSubject: row.transferSubject, clientID: clientID, accessToken: access)
            }
            report.appleCalls += calls
            switch outcome {
            case .subject(let sub, let email, let privateEmail):
                do {
                    guard let record = try await store.transfer(row.transferSubject, on: loop).get() else { report.failed.append(row.transferSubject); continue }
                    if let to = record.to {  // the user signed in meanwhile
                        report.alreadyMapped += 1
                        note(row, record: record, to: to, in: &report)
                        continue
                    }
                    guard let outcome = try await TransferArrival.apply(record, to: sub, email: email, privateEmail: privateEmail, exported: TransferLine.exported(in: record),
                                                                        store: store, at: now(), keep: keep, on: loop) else {
                        report.failed.append(row.transferSubject)  // a sign-in is moving them right now: the next run sees it done
                        continue
                    }
                    if outcome.alreadyMapped {  // a sign-in moved them while we waited (and told the app)
                        report.alreadyMapped += 1
                        note(row, record: record, to: sub, in: &report)
                        continue
                    }
                    // Running gateways drop both identities from their caches: the old one's
                    // sessions ended, the new one's (if any) gain the link.
                    if let from = record.from { await publish(.user(from)) }
                    await publish(.user(sub))
                    await transferred(TransferredUser(sub: sub, formerSub: record.from, transferSubject: row.transferSubject))
                    report.moved += 1
                    report.sessionsEnded += outcome.sessionsEnded
                    if outcome.account != nil { report.linksMoved += 1 }
                    if outcome.linkConflict { report.linkConflicts.append(row.transferSubject) }
                    note(row, record: record, to: sub, in: &report)
                } catch {
                    report.failed.append(row.transferSubject)
                }
            case .refused:
                // Left behind: the exported line stays (its name, email and link) until the record
                // expires, in case Apple maps the user at a sign-in after all.
                report.refused.append(row.transferSubject)
                if let account = row.account { report.refusedAccounts[row.transferSubject] = account }
            case .clientMisconfigured(let error): throw MigrationError("Apple refused our client credentials (\(error)) after \(report.moved) users; run again once fixed")
            case .transient, .transferSubject: report.failed.append(row.transferSubject)
            }
        }
        return report
    }

    /// The allow-list entries the mapped user should have.
    private func note(_ row: TransferLine, record: TransferRecord?, to sub: String, in report: inout ImportReport) {
        for route in configuration.routes {
            let namedBefore = row.routes.contains(route.name) || record?.from.map(route.allow.users.contains) == true
            guard namedBefore, !route.allow.users.contains(sub) else { continue }
            report.allowListChanges[route.name, default: []].append(AllowListChange(sub: sub, replaces: record?.from.flatMap { route.allow.users.contains($0) ? $0 : nil }))
        }
    }
}
