namespace tg {
void link_matmul_ops() {}
}
