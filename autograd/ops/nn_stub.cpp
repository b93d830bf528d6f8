namespace tg {
void link_nn_ops() {}
}
