//! A lock held by its caller across calls (the WIT `lock` resource): writes through it are
//! fenced by it, `release` is idempotent, every use after it is `locked` (nothing sent), and
//! dropping it releases it, best effort.

use std::cell::Cell;
use std::rc::Rc;

use crate::client::{Error, ErrorKind, Transport};
use crate::platform::Platform;

use super::{LockHandle, State, StateStore};

/// A held lock on one state id and the store it belongs to.
pub struct HeldLock<T: Transport, P: Platform> {
    store: Rc<StateStore<T, P>>,
    handle: LockHandle,
    released: Cell<bool>,
}

impl<T: Transport, P: Platform> HeldLock<T, P> {
    /// Acquires the lock on `id` (waits as [`StateStore::lock`] does).
    pub fn acquire(store: Rc<StateStore<T, P>>, id: &str) -> Result<Self, Error> {
        let handle = store.lock(id)?;
        Ok(HeldLock {
            store,
            handle,
            released: Cell::new(false),
        })
    }

    /// The lock's handle (its id and token).
    pub fn handle(&self) -> &LockHandle {
        &self.handle
    }

    /// Extends the lease ([`StateStore::renew`]).
    pub fn renew(&self) -> Result<(), Error> {
        self.check_held()?;
        self.store.renew(&self.handle)
    }

    /// Releases the lock; again after a release it does nothing.
    pub fn release(&self) -> Result<(), Error> {
        if self.released.get() {
            return Ok(());
        }
        self.store.release(&self.handle)?;
        self.released.set(true);
        Ok(())
    }

    /// Overwrites the locked id's state, fenced by this lock ([`StateStore::set_held`]).
    pub fn set(&self, state: &State) -> Result<(), Error> {
        self.check_held()?;
        self.store.set_held(state, &self.handle)
    }

    /// Meltano `update` of the locked id's state, fenced ([`StateStore::update_held`]).
    pub fn update(&self, state: &State) -> Result<State, Error> {
        self.check_held()?;
        self.store.update_held(state, &self.handle)
    }

    /// Deletes the locked id's state, fenced ([`StateStore::delete_held`]).
    pub fn delete(&self) -> Result<u64, Error> {
        self.check_held()?;
        self.store.delete_held(&self.handle.id, &self.handle)
    }

    fn check_held(&self) -> Result<(), Error> {
        if self.released.get() {
            return Err(Error::new(ErrorKind::Locked, "the lock was released"));
        }
        Ok(())
    }
}

impl<T: Transport, P: Platform> Drop for HeldLock<T, P> {
    fn drop(&mut self) {
        if !self.released.get() {
            let _ = self.store.release(&self.handle);
        }
    }
}
